"""The supervisor's decision, as pure functions of facts (no Slurm calls, no files, no clock).

The scheduler is the source of truth; the training process's word only adds detail. One
table decides how a run ended and what to do about it (:func:`decide`); its rows, in order:

==  ================================================  ==============  =====================
#   facts                                             cause           action
==  ================================================  ==============  =====================
1   Slurm already requeued this run (Restarts > ours)  as Slurm saw it  leave it to Slurm
2   Slurm is preempting it (PreemptTime set)           preemption      requeue, any exit code
3   the step exited 0                                  completed       finish (exit 0)
4   Slurm ended the run (scancel, an admin)            cancelled       finish, never undone
5   Slurm's time limit was reached (Reason=TimeLimit)  time_limit      requeue
6   every rank's script returned and its saves are     completed       finish (exit 0), the
    durable (its own word), then a rank died of a                      death named
    signal at exit, a stop passed on ended them, or
    the exit hung
7   the batch step caught the requeue signal           time_limit      requeue
8   it caught SIGTERM/SIGINT, Slurm says nothing       cancelled       finish: a stop request
    (Slurm unreachable: cause ``unknown``, finish)
9   the watchdog stopped a hung step                   hang            restart in place, else
                                                                       requeue (max_hangs)
10  the runtime asked for a requeue (75/76, record;    its cause       requeue
    storage trouble)
11  the step failed                                    user_crash      finish, or (within
                                                                       max_crash_restarts)
                                                                       restart in place, else
                                                                       requeue
==  ================================================  ==============  =====================

Row 6 needs the runtime's word (:mod:`hpctrain.supervisor.finish`) *and* a death that is
not the script's choice: a signal (torch's gloo group aborting in the C++ destructors), a
stop the batch step passed on while they left (torchrun's agent dies of the TERM with exit
code 1 and takes the ranks along), or a teardown the watchdog found hung. It comes after Slurm's own facts (a preemption is still requeued, a
cancellation still final) and before the signals the batch step caught: a time-limit
warning that arrives once every save is durable has nothing left to save, and a requeue
would only repeat the start-up. A script that exits 3 after its work is not completed, and
a script without the runtime that aborts at exit is reported as it ended, with the likely
cause and its fix in the diagnosis.

"requeue" is within the budget (``max_requeues`` and the cause's own limit), else "stop":
the job ends and says which limit. "restart in place" runs the step again in the same
allocation (no queue wait) while ``max_step_restarts`` lasts, the allocation's nodes are
healthy and enough time is left (:class:`InPlace`); a crash's limit counts its in-place
restarts and its requeues together. Not a row: before the step starts, a node failing the
partition's health check gets the job requeued without it, and such a requeue
(``FREE_CAUSES``) does not count against ``max_requeues``. The same rows decide a run that never started its step
(a stop signal or a preemption during start-up): then the step's exit status is unknown.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpctrain.runtime.causes import EXIT_REQUEUE_PREEMPTION, EXIT_REQUEUE_TIME_LIMIT
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.diagnosis import Diagnosis
from hpctrain.supervisor.finish import Finish

REQUEUE_CAUSES = ("preemption", "time_limit", "node_fail", "user_crash", "storage", "hang",
                  "health_check", "requeued")
# requeues that do not count against max_requeues: the site's node check failed, not the job
FREE_CAUSES = ("health_check",)
# how sacct names the end of a run that Slurm requeued, as a requeue cause
CAUSE_OF_RUN_STATE = {"PREEMPTED": "preemption", "TIMEOUT": "time_limit",
                      "NODE_FAIL": "node_fail", "REQUEUED": "requeued"}
RUNTIME_CODES = {EXIT_REQUEUE_PREEMPTION: "preemption", EXIT_REQUEUE_TIME_LIMIT: "time_limit"}
LIMIT_NAMES = {"preemption": "max_preemptions", "time_limit": "max_time_limits",
               "node_fail": "max_node_failures", "user_crash": "max_crash_restarts",
               "storage": "max_storage_retries", "hang": "max_hangs"}


@dataclass(frozen=True)
class Budget:
    """The spec's requeue limits: the total, and one per cause (``requeued``, somebody's
    ``scontrol requeue``, counts for the total only)."""

    max_requeues: int = 10
    per_cause: Mapping[str, int] = field(default_factory=dict)  # cause -> limit

    def limit_of(self, cause: str) -> tuple[str, int] | None:
        """(``max_preemptions``, 2) for a cause with its own limit; None for ``requeued``."""
        name = LIMIT_NAMES.get(cause)
        default = 0 if cause == "user_crash" else self.max_requeues
        return None if name is None else (name, self.per_cause.get(cause, default))


def over_limit(budget: Budget, cause: str, count: int, restart: int) -> str | None:
    """The limit that forbids restart number ``restart`` when it is requeue number ``count``
    of ``cause`` (``max_preemptions=2``), or None when the budget allows it."""
    if restart > budget.max_requeues:
        return f"max_requeues={budget.max_requeues}"
    limit = budget.limit_of(cause)
    if limit is not None and count > limit[1]:
        return f"{limit[0]}={limit[1]}"
    return None


def limit_text(limit: str, cause: str, count: int, restart: int) -> str:
    """``max_preemptions=1 reached (this is preemption requeue 2)``."""
    if limit.startswith("max_requeues="):
        return f"{limit} reached (this is restart {restart})"
    what = "recovery (in place or requeue)" if cause == "user_crash" else "requeue"
    return f"{limit} reached (this is {cause} {what} {count})"


def budget_text(budget: Budget, cause: str, count: int, restart: int) -> str:
    """``restart 2 of max_requeues=10, preemption requeue 1 of max_preemptions=10``."""
    text = f"restart {restart} of max_requeues={budget.max_requeues}"
    limit = budget.limit_of(cause)
    if limit is not None:
        text += f", {cause} requeue {count} of {limit[0]}={limit[1]}"
    return text


@dataclass(frozen=True)
class Caught:
    """A stop signal the batch step caught, and when (epoch seconds)."""

    name: str          # without SIG: USR2, TERM
    at: float
    early: bool = False  # caught by the batch shell before the supervisor took over


@dataclass(frozen=True)
class InPlace:
    """Whether the step may be restarted inside this allocation: its budget
    (``max_step_restarts``, for the whole job) and what stands against it now."""

    max: int = 0
    used: int = 0
    obstacle: str = ""     # "node n2 is DOWN", "43 s left of the allocation"; "" if none

    @property
    def allowed(self) -> bool:
        return self.used < self.max and not self.obstacle

    def why_not(self) -> str:
        if self.used >= self.max:
            return f"max_step_restarts={self.max} spent"
        return self.obstacle


@dataclass(frozen=True)
class Facts:
    """Everything :func:`decide` looks at, gathered once the step has ended (or before it
    started, when a stop came first)."""

    restart_count: int
    requeue_signal: str
    budget: Budget
    requeues: Mapping[str, int]                 # the ledger's requeues by cause
    view: JobView | None                        # Slurm now; None: it could not be asked
    now: float
    status: int | None = None                   # the step's exit status (128+N: signal N)
    caught: Sequence[Caught] = ()
    record: Mapping[str, str] = field(default_factory=dict)  # the runtime's, this run's
    requeued_as: str | None = None              # sacct's end state of this run, as a cause
    hang: str | None = None                     # the watchdog stopped the step: what it saw
    hang_phase: str = ""                        # ...and in which phase ("exited": teardown)
    finish: Finish | None = None                # the ranks' own last word (runtime scripts)
    failure: Diagnosis | None = None            # the first failure, as the launcher told it
    restarts: Mapping[str, int] = field(default_factory=dict)  # in-place restarts by cause
    inplace: InPlace = InPlace()


@dataclass(frozen=True)
class Decision:
    """What to do with the job, why, and what the batch step exits with."""

    action: str        # requeue | restart (in place) | finish | stop (a limit ended it)
    #                    | leave (Slurm requeued)
    cause: str         # completed, preemption, time_limit, node_fail, user_crash, cancelled,
    #                    hang, requeued, unknown
    exit_code: int
    why: str
    limit: str | None = None
    # requeue: "restart 1 of max_requeues=10, ..."; stop: "max_preemptions=1 reached (...)";
    # completed: "rank 1 then died at exit (SIGABRT)" (row 6)
    detail: str = ""


def slurm_event(view: JobView | None, restart_count: int) -> str:
    """Slurm's word on this run: requeued, preemption, time_limit, ended, running, unknown."""
    if view is None:
        return "unknown"
    if view.restarts > restart_count:
        return "requeued"
    if view.preempt_time is not None:
        return "preemption"
    if view.time_limit_reached:
        return "time_limit"
    return "ended" if view.ending else "running"


def warning_due(view: JobView | None, lead_s: int, now: float) -> bool:
    """Is the time-limit warning (``--signal=B:SIG@lead``) due by Slurm's clock? Then a
    run starting now missed it: it came while the script handed over to the supervisor
    (ignored there), and nothing else would tell."""
    return (view is not None and view.end_time is not None and lead_s > 0
            and now >= view.end_time - lead_s)


def notice_cause(caught: str, view: JobView | None, requeue_signal: str) -> str | None:
    """The cause a stop signal stands for when it arrives, for the stop notice the training
    processes read: preemption when Slurm is preempting the job, time_limit for the requeue
    signal (or a reached limit), None for anything else (a scancel)."""
    if view is not None and view.preempt_time is not None:
        return "preemption"
    if caught == requeue_signal or (view is not None and view.time_limit_reached):
        return "time_limit"
    return None


def runtime_word(record: Mapping[str, str], status: int | None) -> str | None:
    """The requeue the training process asked for: exit code 75/76, or its exit record
    (which may also say ``storage``: the checkpoint storage was unavailable)."""
    if status in RUNTIME_CODES:
        return RUNTIME_CODES[status]
    if record.get("requeue") == "1" and record.get("cause") in ("preemption", "time_limit",
                                                                 "storage"):
        return record["cause"]
    return None


def signal_name(status: int | None) -> str:
    """``SIGTERM`` for 143, ``status 3`` otherwise."""
    if status is not None and status > 128:
        try:
            return _signal.Signals(status - 128).name
        except ValueError:
            pass
    return f"status {status}"


def death_at_exit(f: Facts) -> str | None:
    """Row 6: ``rank 1 then died at exit (SIGABRT)`` when the step failed only after every
    rank's work ended with its saves durable; None when that is not what happened."""
    if f.finish is None or not f.finish.done or not f.status:
        return None
    if f.hang_phase == "exited":
        return "their exit then hung and the watchdog ended it"
    died_of = f.failure.signal if f.failure is not None else None
    if died_of is None and f.status > 128:     # srun: 128 + the task's signal
        died_of = signal_name(f.status)
    if died_of is not None and not died_of.startswith("status"):
        rank = f.failure.rank if f.failure is not None else None
        who = "a rank" if rank is None else f"rank {rank}"
        return f"{who} then died at exit ({died_of})"
    if f.caught:
        # the stop was passed on while they left: torchrun's agent dies of a TERM with its
        # own exit code 1, and takes the finished ranks with it
        return f"the stop (SIG{f.caught[-1].name}) then ended the step as they left"
    return None                                # an exit code: the script's own choice


def cause_of_run(f: Facts) -> tuple[str, str]:
    """Rows 2-11 of the table: (cause, why)."""
    event = slurm_event(f.view, f.restart_count)
    names = [c.name for c in f.caught]
    if event == "preemption":
        return "preemption", "Slurm is preempting the job (PreemptTime is set)"
    if f.status == 0:
        return "completed", "the training step exited 0"
    if event == "ended":
        return "cancelled", f"Slurm ended the job ({f.view.state if f.view else ''}, " \
                            "no preemption or time limit: scancel or an admin)"
    if event == "time_limit":
        return "time_limit", "the job reached its time limit"
    death = death_at_exit(f)
    if death is not None:
        return "completed", f"{f.finish.text()}; {death}"  # type: ignore[union-attr]
    if f.requeue_signal in names:
        return "time_limit", f"caught SIG{f.requeue_signal}, the time-limit warning (--signal)"
    stops = [n for n in names if n in ("TERM", "INT")]
    if stops and event == "unknown":
        return "unknown", f"caught SIG{stops[0]} and Slurm could not be asked why"
    if stops:
        return "cancelled", f"caught SIG{stops[0]} without a preemption, time limit or " \
                            "cancellation in Slurm: a stop request"
    if f.hang:
        return "hang", f"the watchdog stopped the hung step: {f.hang}"
    word = runtime_word(f.record, f.status)
    if word is not None:
        return word, f"the training process asked for a requeue ({word})"
    if f.status is None:
        return "unknown", "the training step did not run"
    return "user_crash", f"the training step failed ({signal_name(f.status)})"


def decide(f: Facts) -> Decision:
    """The table in this module's docstring."""
    step_code = f.status if f.status is not None else 0
    if slurm_event(f.view, f.restart_count) == "requeued":
        cause = f.requeued_as or "requeued"
        return Decision("leave", cause, step_code, f"Slurm already requeued the job ({cause})")
    cause, why = cause_of_run(f)
    if cause == "completed":
        return Decision("finish", cause, 0, why, detail=death_at_exit(f) or "")
    if cause in ("cancelled", "unknown") or (cause == "user_crash" and
                                             f.budget.limit_of(cause) == ("max_crash_restarts", 0)):
        return Decision("finish", cause, step_code or 1, why)
    if cause == "user_crash":
        # a crash's limit counts every recovery from a crash, in place or by requeue
        count = f.requeues.get(cause, 0) + f.restarts.get(cause, 0) + 1
        limit = over_limit(f.budget, cause, count, 0)
        if limit is not None:
            return Decision("stop", cause, step_code or 1, why, limit=limit,
                            detail=limit_text(limit, cause, count, f.restart_count))
    if cause in ("hang", "user_crash") and f.inplace.allowed:
        return Decision("restart", cause, 0, why,
                        detail=f"in-place restart {f.inplace.used + 1} of "
                               f"max_step_restarts={f.inplace.max}")
    count = f.requeues.get(cause, 0) + 1
    if cause == "user_crash":
        count += f.restarts.get(cause, 0)
    restart = f.restart_count + 1 - sum(f.requeues.get(c, 0) for c in FREE_CAUSES)
    limit = over_limit(f.budget, cause, count, restart)
    if limit is not None:
        return Decision("stop", cause, step_code or 1, why, limit=limit,
                        detail=limit_text(limit, cause, count, restart))
    detail = budget_text(f.budget, cause, count, restart)
    if cause in ("hang", "user_crash") and f.inplace.max:
        detail += f"; not in place: {f.inplace.why_not()}"
    return Decision("requeue", cause, 0, why, detail=detail)


# ---- the start of a run: requeues that happened without a supervisor to count them ----------
def missing_requeues(known: int, restart_count: int, previous_word: str | None,
                     run_states: Sequence[str]) -> list[tuple[int, str]]:
    """(restart number, cause) of every requeue the ledger has no line for: its run's
    supervisor did not live to write it (node loss) or Slurm requeued it first.

    The newest one takes the previous run's own word (its verdict, the runtime's requeue
    record or the stop notice) when there is one; any of them how sacct saw that run end
    (PREEMPTED, TIMEOUT, NODE_FAIL, REQUEUED); else a node failure, the one requeue nobody
    lives to report.
    """
    out = []
    for restart in range(known + 1, restart_count + 1):
        cause = previous_word if restart == restart_count else None
        if not cause and restart - 1 < len(run_states):
            cause = CAUSE_OF_RUN_STATE.get(run_states[restart - 1])
        out.append((restart, cause or "node_fail"))
    return out
