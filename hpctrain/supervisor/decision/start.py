"""The start of a run: the requeues nobody entered in the ledger yet (Slurm's own: a
preemption, a node failure, an operator's ``scontrol requeue``), why the last one happened,
whether it went past a limit of the job's budget (then this run stops before it starts
anything), and whether the time-limit warning is already due. Pure.

Slurm is the source of truth: a run the ledger does not know about is entered from its
previous run's own word when there is one, else from ``sacct``'s run states.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpctrain.protocol.ledger import Ledger
from hpctrain.protocol.records import ExitRecord, Verdict
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.decision.budget import Budget, counted, limit_text, over_limit
from hpctrain.supervisor.decision.facts import Caught, Decision, slurm_event, why_run_ended


def previous_cause(verdict: Verdict | None, record: ExitRecord | None,
                   notice: str | None) -> str | None:
    """Why the previous run ended, in its own words (:func:`why_run_ended`: its verdict,
    its stop notice, the runtime's request); None when none says, and only then is sacct
    asked (one call spared on every ordinary restart)."""
    return why_run_ended(verdict=verdict, notice=notice, record=record)


def needs_sacct(known: int, restart_count: int, previous: str | None) -> bool:
    """Must sacct be asked how the runs nobody counted ended? Only the newest has a word."""
    return restart_count - known > 1 or previous is None


def missing_requeues(known: int, restart_count: int, previous: str | None,
                     run_states: Sequence[str]) -> list[tuple[int, str]]:
    """(restart number, cause) of every requeue the ledger has no line for: its run's
    supervisor did not live to write it (node loss) or Slurm requeued it first.

    The newest one takes the previous run's own word (:func:`previous_cause`) when there is
    one; any of them how sacct saw that run end (PREEMPTED, TIMEOUT, NODE_FAIL, REQUEUED);
    else a node failure, the one requeue nobody lives to report.
    """
    out = []
    for restart in range(known + 1, restart_count + 1):
        cause = previous if restart == restart_count else None
        if not cause and restart - 1 < len(run_states):
            cause = why_run_ended(run_state=run_states[restart - 1])
        out.append((restart, cause or "node_fail"))
    return out


def start_verdict(budget: Budget, ledger: Ledger, restart_count: int
                  ) -> tuple[str | None, Decision | None]:
    """(why the last run ended, or None on a first run; a stop decision when that requeue
    went past a limit of the budget, else None). ``ledger`` already holds every requeue."""
    if restart_count == 0:
        return None, None
    cause = ledger.last_cause or "node_fail"
    count = ledger.requeues.get(cause, 0)
    # only the supervisor requeues a crash, and only within the budget it judged then: a
    # crash's default (larger under hpctrain.runtime.run) is taken as that run's
    limit = over_limit(budget, cause, count, counted(restart_count, ledger.requeues),
                       wrapped=cause == "user_crash")
    if limit is None:
        return cause, None
    return cause, Decision("stop", cause, 1, "not run again", limit=limit,
                           detail=limit_text(limit, cause, count, restart_count))


def decide_before_start(view: JobView | None, restart_count: int,
                        caught: Sequence[Caught]) -> bool:
    """Is this run decided before its step starts? When a stop came during the set-up, or
    Slurm is already ending the run (a preemption during start-up)."""
    return bool(caught) or (view is not None and slurm_event(view, restart_count) != "running")


def warning_due(view: JobView | None, lead_s: int, now: float) -> bool:
    """Is the time-limit warning (``--signal=B:SIG@lead``) due by Slurm's clock? Then a
    run starting now missed it: it came while the script handed over to the supervisor
    (ignored there), and nothing else would tell."""
    return (view is not None and view.end_time is not None and lead_s > 0
            and now >= view.end_time - lead_s)


def warning_at(view: JobView | None, lead_s: int) -> float | None:
    """When the time-limit warning is due by Slurm's end time (epoch s); None without a
    limit or a warning."""
    if view is None or view.end_time is None or lead_s <= 0:
        return None
    return view.end_time - lead_s
