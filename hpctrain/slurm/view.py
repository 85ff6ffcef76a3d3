"""What ``scontrol show job`` says about one job, interpreted. Pure (no Slurm call).

As seen from inside the batch step on Slurm 22.05 (docs/fault-recovery.md has the table):
a requeue (preemption at the end of GraceTime, node failure, ``scontrol requeue``) raises
``Restarts`` at once; a preemption sets ``PreemptTime`` when GraceTime starts and lowers
``EndTime`` to its end; the time limit shows ``Reason=TimeLimit``; a scancel shows
``COMPLETING`` with none of these. While a job ends, ``JobState`` reads ``COMPLETING``
whatever the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class JobView:
    """``scontrol show job KEY`` at one moment, the fields the supervisor decides with."""

    key: str
    state: str                  # RUNNING, COMPLETING (hides why), PENDING, ...
    reason: str                 # TimeLimit, None, BeginTime, ...
    restarts: int               # Slurm's requeue count: above ours = already requeued
    preempt_time: float | None  # set once the job was picked for preemption
    end_time: float | None      # the time limit (the end of GraceTime when preempted)
    requeue: bool               # Requeue=1: Slurm may requeue it
    std_err: str = ""           # the job's stderr file (the batch log)
    node_list: str = ""
    std_out: str = ""
    partition: str = ""
    num_nodes: int = 0
    excluded: str = ""          # ExcNodeList: nodes the job must not run on

    @property
    def time_limit_reached(self) -> bool:
        return self.reason == "TimeLimit"

    @property
    def ending(self) -> bool:
        """Slurm has ended the run (scancel, time limit, node failure) and is cleaning up."""
        return self.state in ("COMPLETING", "CANCELLED", "TIMEOUT", "NODE_FAIL", "FAILED",
                              "COMPLETED", "PREEMPTED", "BOOT_FAIL", "DEADLINE")


def slurm_time(text: str) -> float | None:
    """Slurm's local ``2026-11-23T07:15:46`` as epoch seconds; None for None/Unknown."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def job_view(key: str, record: dict[str, str]) -> JobView:
    """A :class:`JobView` from one parsed ``scontrol show job -o`` record. Pure."""
    restarts = record.get("Restarts", "0")
    return JobView(
        key=key, state=record.get("JobState", ""), reason=record.get("Reason", ""),
        restarts=int(restarts) if restarts.isdigit() else 0,
        preempt_time=slurm_time(record.get("PreemptTime", "")),
        end_time=slurm_time(record.get("EndTime", "")),
        requeue=record.get("Requeue", "1") != "0",
        std_err=record.get("StdErr", ""), node_list=record.get("NodeList", ""),
        std_out=record.get("StdOut", ""), partition=record.get("Partition", ""),
        num_nodes=_leading_int(record.get("NumNodes", "")),
        excluded="" if record.get("ExcNodeList") in (None, "(null)") else record["ExcNodeList"])


def _leading_int(text: str) -> int:
    """``2`` or ``2-2`` (a pending job's range) -> 2; 0 when there is no number."""
    head = text.split("-")[0]
    return int(head) if head.isdigit() else 0
