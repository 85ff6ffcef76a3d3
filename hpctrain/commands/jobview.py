"""Job views shared by submit/status/logs/cancel/sweep: formatting only, no Slurm calls."""

from __future__ import annotations

from typing import Any

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


def current_record(record: dict[str, str], restarts: int | None) -> dict[str, str]:
    """``record`` unless it is a stale crash record: one with ``requeue=0`` from an
    earlier run that was requeued anyway (Slurm requeued it after a node failure, and the
    surviving ranks had died of the lost peers). ``restarts``: runs before the current
    one (sacct's count), None when unknown."""
    stale = (record.get("requeue") == "0" and restarts is not None
             and record.get("restart_count", "0") != str(restarts))
    return {} if stale else record


def format_cause(record: dict[str, str]) -> str:
    """The exit record in one short cell: ``user_crash@7 RuntimeError: ...`` for a crash,
    ``last requeue: preemption@40`` when the record asked for a requeue, ``-`` without one."""
    cause = record.get("cause")
    if not cause:
        return "-"
    at = f"@{record['step']}" if record.get("step") else ""
    if record.get("requeue") == "1":
        return f"last requeue: {cause}{at}"
    error = f" {record['error']}" if record.get("error") else ""
    return f"{cause}{at}{error}"


def info_json(info: Any) -> dict[str, Any]:
    return {"state": str(info.state), "slurm_state": info.slurm_state,
            "outcome": info.state.outcome.value, "elapsed_s": info.elapsed_s,
            "nodes": info.nodes, "num_nodes": info.num_nodes, "exit_code": info.exit_code,
            "reason": info.reason, "requeues": info.requeues}


def job_json(job: Any, **extra: Any) -> dict[str, Any]:
    return {"job_id": job.job_id, "name": job.name, "kind": job.record.kind,
            "paths": {"folder": job.folder, "submission_file": str(job.submission_file),
                      "log": extra.pop("log", job.record.log),
                      "checkpoint_dir": job.record.checkpoint_dir}, **extra}


def progress_line(job: Any, info: Any) -> str:
    """One line of ``submit --wait`` progress."""
    from hpctrain.watcher import last_checkpoint_step

    step = last_checkpoint_step(job.record.checkpoint_dir)
    return (f"job {job.job_id}: {info.state}  elapsed {format_elapsed(info.elapsed_s)}  "
            f"requeues {format_requeues(info.requeues)}  "
            f"last checkpoint step {'-' if step is None else step}")


def exit_code_for(info: Any) -> int:
    """0 when the job COMPLETED; otherwise non-zero (distinct for cancellations)."""
    outcome = info.state.outcome
    if outcome is Outcome.SUCCESS:
        return 0
    return 7 if outcome is Outcome.CANCELLED else 6
