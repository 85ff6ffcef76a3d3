"""How submit/status/logs/cancel/sweep show a job: formatting only, no Slurm calls (the
view itself is :mod:`hpctrain.jobs.view`'s)."""

from __future__ import annotations

from typing import Any

from hpctrain.protocol.records import Verdict
from hpctrain.slurm.states import Outcome


def format_elapsed(seconds: int | None) -> str:
    """Seconds -> ``1-02:03:04`` / ``02:03:04`` / ``-``."""
    if seconds is None:
        return "-"
    days, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    text = f"{h:02d}:{m:02d}:{s:02d}"
    return f"{days}-{text}" if days else text


def format_requeues(requeues: dict[str, int]) -> str:
    """``{"preemption": 2, "time_limit": 1}`` -> ``preemption:2 time_limit:1`` (``-`` when none)."""
    return " ".join(f"{k}:{v}" for k, v in sorted(requeues.items())) or "-"


def format_cause(verdict: Verdict | None) -> str:
    """The supervisor's verdict on the last run in one short cell: ``user_crash@7
    ValueError: boom (rank 1, n2)`` for a crash, ``last requeue: preemption@40`` while a
    requeued job goes on, ``requeue limit max_preemptions=1 reached``; ``-`` without one."""
    if verdict is None:
        return "-"
    cause, action = verdict.cause, verdict.action
    if cause == "completed" and verdict.detail:
        return f"finished; {verdict.detail}"   # a rank died at exit, nothing was lost
    if not cause or cause == "completed":
        return "-"
    at = f"@{verdict.step}" if verdict.step is not None else ""
    if action in ("requeue", "leave"):
        return f"last requeue: {cause}{at}"
    if action == "stop" and verdict.limit:
        return f"requeue limit {verdict.limit} reached"
    if action == "requeue_failed":
        return f"{cause}{at}: the requeue failed"
    if action == "restart":
        return f"restarted in place after a {cause}{at}"
    where = ", ".join(x for x in (f"rank {verdict.rank}" if verdict.rank is not None else "",
                                  verdict.node) if x)
    error = verdict.error
    text = f"{cause}{at} {error}".strip()
    return f"{text} ({where})" if where else text


def job_json(job: Any, **extra: Any) -> dict[str, Any]:
    return {"job_id": job.job_id, "name": job.name, "kind": job.entry.kind,
            "paths": {"folder": job.folder, "submission_file": str(job.submission_file),
                      "log": extra.pop("log", job.entry.log),
                      "checkpoint_dir": job.entry.checkpoint_dir}, **extra}


def progress_line(job: Any, info: Any) -> str:
    """One line of ``submit --wait`` progress (a running job's supervisor asked for its
    step)."""
    from hpctrain.jobs.view import wait_progress

    live, step = wait_progress(job.job_id, job.entry, running=str(info.state) == "RUNNING")
    return (f"job {job.job_id}: {info.state}  elapsed {format_elapsed(info.elapsed_s)}  "
            f"{live + '  ' if live else ''}requeues {format_requeues(info.requeues)}  "
            f"last checkpoint step {'-' if step is None else step}")


def exit_code_for(info: Any) -> int:
    """0 when the job COMPLETED; otherwise non-zero (distinct for cancellations)."""
    outcome = info.state.outcome
    if outcome is Outcome.SUCCESS:
        return 0
    # 8, not 7: 7 is --host's "the cluster could not be reached" (hpctrain.errors.EXIT_CODES)
    return 8 if outcome is Outcome.CANCELLED else 6
