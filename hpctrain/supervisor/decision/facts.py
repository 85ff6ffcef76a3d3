"""What the decisions look at and what they return: the facts of a run (gathered by the
supervisor, raw: as Slurm, the ranks and the clock gave them), the decision itself, and
the small readings of raw facts every rule shares. Pure."""

from __future__ import annotations

import hashlib
import signal as _signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpctrain.protocol.records import ExitRecord, Verdict
from hpctrain.runtime.causes import EXIT_REQUEUE_PREEMPTION, EXIT_REQUEUE_TIME_LIMIT
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.decision.budget import REQUEUE_CAUSES, Budget
from hpctrain.supervisor.diagnosis import Diagnosis
from hpctrain.supervisor.finish import Finish

# how sacct names the end of a run that Slurm requeued, as a requeue cause
CAUSE_OF_RUN_STATE = {"PREEMPTED": "preemption", "TIMEOUT": "time_limit",
                      "NODE_FAIL": "node_fail", "REQUEUED": "requeued"}
RUNTIME_CODES = {EXIT_REQUEUE_PREEMPTION: "preemption", EXIT_REQUEUE_TIME_LIMIT: "time_limit"}
MIN_LEFT_S = 30.0     # an in-place restart needs this much beyond the warning's lead


@dataclass(frozen=True)
class Caught:
    """A stop signal the batch step caught, and when (epoch seconds)."""

    name: str          # without SIG: USR2, TERM
    at: float
    early: bool = False  # caught by the batch shell before the supervisor took over


@dataclass(frozen=True)
class InPlace:
    """What stands for and against restarting the step inside this allocation: its budget
    (``max_step_restarts``, for the whole job) and the allocation's health and time."""

    max: int = 0
    used: int = 0
    frozen: tuple[str, ...] = ()                     # nodes whose ranks stopped answering
    unhealthy: Mapping[str, str] = field(default_factory=dict)  # node -> Slurm's state
    left_s: float | None = None                      # seconds left of the allocation
    lead_s: int = 0                                  # the time-limit warning's lead
    healthy: int | None = None   # [elastic]: the allocation's good nodes (spares included)
    needed: int = 0              # ...and how many the step runs on
    batch_lost: str = ""         # the batch node, found lost: the step cannot run without it
    batch_fault: str = ""        # ...or its ranks died wordless again (a fault of the node)
    fewest: int = 0              # ...and the fewest it may shrink to ([elastic] min_nodes)
    batch_bad: str = ""          # [elastic] the batch node noted bad otherwise ("n1 (hang)")

    @property
    def obstacle(self) -> str:
        """What forbids a restart here ('' when nothing does): ranks that stopped
        answering, then a node Slurm calls unhealthy (with spare nodes: too few good nodes
        left for the step instead), then too little time left."""
        if self.batch_lost:
            return f"the batch node {self.batch_lost} answered no step (the supervisor and " \
                   "the rendezvous are there)"
        if self.batch_fault:
            return f"the ranks on the batch node {self.batch_fault} died without a word " \
                   "again (the supervisor and the rendezvous are there: no step runs " \
                   "without it)"
        if self.batch_bad:    # a spare or a shrink would place the step without it
            return f"the batch node {self.batch_bad} is noted bad (the supervisor and the " \
                   "rendezvous are there: no step runs without it)"
        if self.healthy is not None:    # spare nodes: a bad node is left out, if one is left
            if self.healthy < self.least:
                shrink = f" and it may shrink to no fewer than {self.least} ([elastic] " \
                    "min_nodes)" if self.least < self.needed else ""
                return f"{self.healthy} good node(s) left of the {self.needed} the step " \
                       f"needs: no spare node is left{shrink}"
        elif self.frozen:
            return f"rank(s) on {','.join(self.frozen)} stopped answering"
        elif self.unhealthy:
            return "node(s) " + ", ".join(f"{n} {s}" for n, s in self.unhealthy.items())
        if self.left_s is not None and self.left_s < self.lead_s + MIN_LEFT_S:
            return f"only {max(self.left_s, 0):.0f} s of the allocation left"
        return ""

    @property
    def least(self) -> int:
        """The fewest nodes a restart here may run on (the full width without a shrink)."""
        return self.fewest or self.needed

    @property
    def shrinks(self) -> bool:
        """Would a restart here run on fewer nodes than the full width (no spare left)?"""
        return self.healthy is not None and self.healthy < self.needed

    @property
    def allowed(self) -> bool:
        return self.used < self.max and not self.obstacle

    def why_not(self) -> str:
        if self.used >= self.max:
            return f"max_step_restarts={self.max} spent"
        return self.obstacle


@dataclass(frozen=True)
class Facts:
    """Everything :func:`~hpctrain.supervisor.decision.table.decide` looks at, gathered
    once the step has ended (or before it started, when a stop came first)."""

    restart_count: int
    requeue_signal: str
    budget: Budget
    requeues: Mapping[str, int]                 # the ledger's requeues by cause
    view: JobView | None                        # Slurm now; None: it could not be asked
    now: float
    status: int | None = None                   # the step's exit status (128+N: signal N)
    caught: Sequence[Caught] = ()
    record: ExitRecord | None = None            # the runtime's exit record, this run's
    run_state: str | None = None                # sacct's end state of this run (requeued)
    notice: str | None = None                   # the stop notice's cause, this run's
    hang: str | None = None                     # the watchdog stopped the step: what it saw
    hang_phase: str = ""                        # ...and in which phase ("exited": teardown)
    restarts: Mapping[str, int] = field(default_factory=dict)  # in-place restarts by cause
    inplace: InPlace = InPlace()
    finish: Finish | None = None                # the ranks' own last word (runtime scripts)
    lost: tuple[str, ...] = ()                  # the step's nodes lost
    faulty: tuple[str, ...] = ()                # ...whose ranks died wordless, node answering
    slow: tuple[str, ...] = ()                  # ...taken out for slowness (a spare replaces)
    failure: Diagnosis | None = None            # the first failure, as the launcher told it
    memory: str | None = None                   # Slurm ended the step for memory: its words
    port: tuple[int, int] | None = None         # the rendezvous port was taken: (it, the next)
    wrapped: bool = False                       # the ranks run under hpctrain.runtime.run
    crashes: tuple[str, ...] = ()               # the job's earlier crashes (crash_signature)
    shrunk_failed: str = ""     # [elastic] min_nodes: the step ran shrunk ("2 of 4 GPUs")
    #                             and failed before any rank finished a step in it


@dataclass(frozen=True)
class Decision:
    """What to do with the job, why, and what the batch step exits with."""

    action: str        # requeue | restart (in place) | finish | stop (a limit ended it)
    #                    | leave (Slurm requeued)
    cause: str         # completed, preemption, time_limit, node_fail, user_crash, cancelled,
    #                    hang, out_of_memory, port_taken, requeued, health_check, unknown
    exit_code: int
    why: str
    limit: str | None = None
    # requeue: "restart 1 of max_requeues=10, ..."; stop: "max_preemptions=1 reached (...)";
    # completed: "rank 1 then died at exit (SIGABRT)" (row died-at-exit)
    detail: str = ""

    @property
    def about_a_failure(self) -> bool:
        """Does the verdict name the run's first failure: a crash, a run that ended for no
        known reason, or a rank that died at exit after the work was done (row died-at-exit)?"""
        return self.cause in ("user_crash", "out_of_memory", "unknown") or \
            (self.cause == "completed" and bool(self.detail))


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


def runtime_word(record: ExitRecord | None, status: int | None) -> str | None:
    """The requeue the training process asked for: exit code 75/76, or its exit record
    (which may also say ``storage``: the checkpoint storage was unavailable)."""
    if status in RUNTIME_CODES:
        return RUNTIME_CODES[status]
    return record.asks_requeue if record is not None else None


def why_run_ended(*, verdict: Verdict | None = None, run_state: str | None = None,
                  notice: str | None = None, record: ExitRecord | None = None,
                  status: int | None = None) -> str | None:
    """Why a requeued run ended, as a requeue cause; None when nobody says. One order for
    every question of it: the run's supervisor's verdict (when it requeued or saw Slurm
    do it), then sacct's specific end state (PREEMPTED, TIMEOUT, NODE_FAIL), then the stop
    notice the ranks were given, then the runtime's own request, then sacct's bare
    REQUEUED (somebody's ``scontrol requeue``). The runtime's "preemption" is its reading
    of a TERM that came without a notice: beside sacct's bare REQUEUED (a preemption
    would be PREEMPTED) it gives way to Slurm's fact."""
    if verdict is not None and verdict.action in ("requeue", "leave") and \
            verdict.cause in REQUEUE_CAUSES:
        return verdict.cause
    seen = CAUSE_OF_RUN_STATE.get(run_state or "")
    if seen is not None and seen != "requeued":
        return seen
    if notice in ("preemption", "time_limit"):
        return notice
    word = runtime_word(record, status)
    if seen == "requeued" and word == "preemption":
        return seen
    return word or seen


def signal_name(status: int | None) -> str:
    """``SIGTERM`` for 143, ``status 3`` otherwise."""
    if status is not None and status > 128:
        try:
            return _signal.Signals(status - 128).name
        except ValueError:
            pass
    return f"status {status}"


def crash_step(record: ExitRecord | None) -> int | None:
    """The step a crash record places the crash at (:attr:`ExitRecord.crash_step`); None
    when neither the script nor the runtime knew it, or there is no record."""
    return record.crash_step if record is not None else None


def crash_signature(record: ExitRecord | None) -> str | None:
    """``20:3f2a9c01d4e7``: a crash's step and a digest of its error (the exception's type
    and message, as the crash record has them), for the ledger and the repeated-crash rule;
    None when the record is not a crash's or lacks either (a plain script's crash)."""
    if record is None or record.cause != "user_crash" or record.crash_step is None or \
            not record.error:
        return None
    step, error = record.crash_step, record.error
    # the runtime's digest of the whole error (the record's error is cut at 300 characters)
    digest = record.error_digest or hashlib.sha256(error.encode()).hexdigest()
    return f"{step}:{digest[:12]}"
