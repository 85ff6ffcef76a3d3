"""Why a job stopped, and what the supervisor makes of it: one small table.

The exit-code protocol between the training process and its supervisor:

- ``0``: training finished; the job completes.
- ``75`` (EX_TEMPFAIL): stopped on the *preemption* signal (SIGTERM by default)
  after the emergency checkpoint; requeue me.
- ``76``: stopped on the *time-limit* signal (SIGUSR2, sent ``signal_lead_s``
  before the limit) after the emergency checkpoint; requeue me.
- anything else: the supervisor asks Slurm what happened; without a preemption, time
  limit or node loss it is a crash, not requeued (unless ``max_crash_restarts``).

Launchers such as ``torchrun`` replace a worker's exit code with their own (``1``),
so :meth:`hpctrain.runtime.Context.exit_for_requeue` also writes an *exit record*
(``$HPCTRAIN_EXIT_FILE``, ``key=value`` lines) that the supervisor reads; see
docs/fault-recovery.md. These codes are the runtime's word: detail the supervisor adds
to Slurm's facts, which decide.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from hpctrain.protocol.records import StopNotice, of_run

EXIT_COMPLETED = 0
EXIT_REQUEUE_PREEMPTION = 75
EXIT_REQUEUE_TIME_LIMIT = 76
REQUEUE_EXIT_CODES = (EXIT_REQUEUE_PREEMPTION, EXIT_REQUEUE_TIME_LIMIT)


@dataclass(frozen=True)
class ExitCause:
    """One row of the policy table."""

    name: str
    code: int  # severity, all_reduce(MAX) picks the most urgent cause across ranks
    exit_code: int | None  # what the process exits with; None: not chosen by the process
    requeue: bool
    resume_from: str


CAUSES: dict[str, ExitCause] = {c.name: c for c in (
    ExitCause("completed", 0, EXIT_COMPLETED, False, "nothing: the job is done"),
    ExitCause("time_limit", 1, EXIT_REQUEUE_TIME_LIMIT, True, "the emergency checkpoint"),
    ExitCause("preemption", 2, EXIT_REQUEUE_PREEMPTION, True, "the emergency checkpoint"),
    # NODE_FAIL: Slurm requeues the job itself; no process lives to write anything.
    ExitCause("node_fail", 3, None, True, "the last periodic checkpoint"),
    ExitCause("user_crash", 4, None, False, "nothing: not requeued, the job ends FAILED"),
    # the checkpoint storage was unavailable (a root locked by a dead node's job): the
    # crash record says so, and the supervisor requeues within max_storage_retries
    ExitCause("storage", 5, None, True, "the last checkpoint, once the storage is back"),
)}
BY_CODE = {c.code: c for c in CAUSES.values()}


def cause_of_signal(signum: int, *, now: float | None = None, end_time: float | None = None,
                    lead_s: float | None = None) -> ExitCause:
    """Map a received stop signal to a cause.

    Without timing facts: SIGUSR2 is the time-limit warning, anything else (SIGTERM)
    preemption. With them (``SLURM_JOB_END_TIME`` and the template's lead) the time
    left decides, whatever the signal: the supervisor forwards USR2 to torchrun as TERM
    (torchrun dies of USR2), and Slurm's ``send_user_signal`` delivers USR2 on
    preemption. Near the end of the job it is the time limit, otherwise preemption.
    """
    if None not in (now, end_time, lead_s):
        remaining = end_time - now  # type: ignore[operator]
        # twice the lead plus a minute of slack: Slurm's signal timer ticks coarsely
        near_end = remaining <= 2 * lead_s + 60  # type: ignore[operator]
        return CAUSES["time_limit" if near_end else "preemption"]
    return CAUSES["time_limit" if signum == signal.SIGUSR2 else "preemption"]


def cause_of_stop(signum: int, notice: StopNotice | None, restart_count: int, *,
                  now: float | None = None, end_time: float | None = None,
                  lead_s: float | None = None, run_id: str | None = None) -> ExitCause:
    """Why a stop signal came: the supervisor's stop notice for this run when it left
    one (it asked Slurm whether the job is being preempted before passing the signal on),
    else :func:`cause_of_signal` (a signal Slurm sent the step directly)."""
    if (of_run(notice, run_id, restart_count)
            and notice is not None and notice.cause in ("preemption", "time_limit")):
        return CAUSES[notice.cause]
    return cause_of_signal(signum, now=now, end_time=end_time, lead_s=lead_s)


def cause_of_exit_code(exit_code: int) -> ExitCause:
    """What a training process's exit code says on its own from a training process's exit code."""
    for cause in CAUSES.values():
        if cause.exit_code == exit_code:
            return cause
    return CAUSES["user_crash"]
