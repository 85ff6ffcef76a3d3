"""THE one table from Slurm job states to hpctrain states.

Every place that shows or acts on a job's state (``status``, ``submit --wait``,
``Job.state``, the watcher) goes through :func:`from_slurm`. Interruptions stay
distinct: PREEMPTED, REQUEUED, TIMEOUT and NODE_FAIL are never reported as a plain
failure, because hpctrain's answer to each is different (requeue and resume) from its
answer to a crash (stop and show the cause).

Pure: no subprocess, no environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Outcome(str, Enum):
    """What a state means for the user, coarsely."""

    ACTIVE = "active"            # queued or running: wait
    SUCCESS = "success"          # finished well
    INTERRUPTED = "interrupted"  # stopped by the cluster, not by the code: may be requeued
    FAILURE = "failure"          # the job's own fault (or the user's resources)
    CANCELLED = "cancelled"      # someone cancelled it
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class State:
    """One hpctrain state: its name, what it means, and whether it can still change."""

    name: str
    outcome: Outcome
    # True: Slurm will not move the job on by itself. INTERRUPTED states are final only
    # when the job is no longer queued (Slurm did not requeue it): see may_resume.
    final: bool
    # the requeue cause this state stands for, when a run ended in it and the job came back
    cause: str | None = None
    description: str = ""

    @property
    def may_resume(self) -> bool:
        """An interruption after which Slurm (or the job's script) may requeue the job."""
        return self.outcome is Outcome.INTERRUPTED

    @property
    def failed(self) -> bool:
        """A genuine failure (exit code, OOM, boot failure): not an interruption."""
        return self.outcome is Outcome.FAILURE

    def __str__(self) -> str:
        return self.name


def _s(name: str, outcome: Outcome, final: bool, cause: str | None = None,
       description: str = "") -> State:
    return State(name, outcome, final, cause, description)


A, S, I, F, C = (Outcome.ACTIVE, Outcome.SUCCESS, Outcome.INTERRUPTED, Outcome.FAILURE,
                 Outcome.CANCELLED)

# Slurm state (sacct/squeue long name) -> hpctrain state. Keep this the only table.
TABLE: dict[str, State] = {
    "PENDING": _s("PENDING", A, False, description="waiting for resources or priority"),
    "CONFIGURING": _s("STARTING", A, False, description="nodes being prepared"),
    "RUNNING": _s("RUNNING", A, False),
    "COMPLETING": _s("COMPLETING", A, False, description="processes ending"),
    "STAGE_OUT": _s("COMPLETING", A, False, description="staging out"),
    "SIGNALING": _s("RUNNING", A, False, description="being signalled"),
    "RESIZING": _s("RUNNING", A, False),
    "SUSPENDED": _s("SUSPENDED", A, False, description="suspended by the scheduler"),
    "STOPPED": _s("SUSPENDED", A, False, description="stopped (SIGSTOP)"),
    "REQUEUE_HOLD": _s("HELD", A, False, description="requeued and held: `scontrol release`"),
    "REQUEUE_FED": _s("REQUEUED", I, False, "requeued"),
    "RESV_DEL_HOLD": _s("HELD", A, False, description="reservation deleted: held"),
    "SPECIAL_EXIT": _s("HELD", A, False, description="special exit: held"),
    "REQUEUED": _s("REQUEUED", I, False, "requeued", "requeued (scontrol requeue), back in the queue"),
    "PREEMPTED": _s("PREEMPTED", I, True, "preemption", "preempted by a higher-priority job"),
    "TIMEOUT": _s("TIMEOUT", I, True, "time_limit", "hit its time limit"),
    "NODE_FAIL": _s("NODE_FAIL", I, True, "node_fail", "a node of the allocation was lost"),
    "COMPLETED": _s("COMPLETED", S, True),
    "FAILED": _s("FAILED", F, True, "failed", "exited non-zero"),
    "OUT_OF_MEMORY": _s("OUT_OF_MEMORY", F, True, "out_of_memory", "ran out of memory"),
    "BOOT_FAIL": _s("BOOT_FAIL", F, True, "boot_fail", "a node failed to boot"),
    "DEADLINE": _s("DEADLINE", F, True, "deadline", "missed its --deadline"),
    "REVOKED": _s("CANCELLED", C, True, description="revoked (federation)"),
    "CANCELLED": _s("CANCELLED", C, True, "cancelled", "cancelled (scancel)"),
}
UNKNOWN = _s("UNKNOWN", Outcome.UNKNOWN, False, description="Slurm has no record (yet)")
# Without accounting (no sacct) a job that left squeue has ended, outcome not known.
ENDED = _s("ENDED", Outcome.UNKNOWN, True, description="left the queue; without sacct the outcome is unknown")

# squeue's short codes (``%t``) -> the long names above
SHORT_CODES: dict[str, str] = {
    "PD": "PENDING", "CF": "CONFIGURING", "R": "RUNNING", "CG": "COMPLETING",
    "SO": "STAGE_OUT", "SI": "SIGNALING", "RS": "RESIZING", "S": "SUSPENDED",
    "ST": "STOPPED", "RH": "REQUEUE_HOLD", "RF": "REQUEUE_FED", "RD": "RESV_DEL_HOLD",
    "SE": "SPECIAL_EXIT", "RQ": "REQUEUED", "PR": "PREEMPTED", "TO": "TIMEOUT",
    "NF": "NODE_FAIL", "CD": "COMPLETED", "F": "FAILED", "OOM": "OUT_OF_MEMORY",
    "BF": "BOOT_FAIL", "DL": "DEADLINE", "RV": "REVOKED", "CA": "CANCELLED",
}

# the hpctrain state names, in the order `status` lists per-state counts
ORDER = ("RUNNING", "STARTING", "COMPLETING", "PENDING", "HELD", "SUSPENDED", "REQUEUED",
         "PREEMPTED", "TIMEOUT", "NODE_FAIL", "COMPLETED", "FAILED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "CANCELLED", "ENDED", "UNKNOWN")


def from_slurm(raw: str) -> State:
    """Map one Slurm state string to the hpctrain state.

    Accepts sacct's long names with trailing detail ("CANCELLED by 0"), squeue's short
    codes ("PD") and any case; anything unrecognised is UNKNOWN, never a failure.
    """
    word = raw.strip().split(" ")[0].rstrip("+").upper() if raw.strip() else ""
    word = SHORT_CODES.get(word, word)
    return TABLE.get(word, UNKNOWN)


def by_name(name: str) -> State:
    """The hpctrain state called ``name`` (as :func:`str` prints it); UNKNOWN otherwise."""
    for state in (*TABLE.values(), ENDED):
        if state.name == name:
            return state
    return UNKNOWN
