"""Slurm's node states, as the devcluster judges them (pure): may a job start on a node,
and does a node stay out until somebody resumes it."""

from __future__ import annotations

# Node state flags (scontrol's State=BASE+FLAG+...) under which Slurm places no new job.
_UNUSABLE_FLAGS = ("DRAIN", "FAIL", "NOT_RESPONDING", "POWER", "MAINT", "REBOOT", "INVALID")


def node_usable(state: str) -> bool:
    """Whether Slurm would start a job on a node in ``state``: IDLE+DRAIN is not usable."""
    base, *flags = state.split("+")
    return (base in ("IDLE", "MIXED", "ALLOCATED")
            and not any(flag.startswith(_UNUSABLE_FLAGS) for flag in flags))


def node_held(state: str) -> bool:
    """Whether a node in ``state`` stays out until somebody resumes it (DOWN, DRAIN, FAIL)."""
    base, *flags = state.split("+")
    return base == "DOWN" or any(flag in ("DRAIN", "FAIL") for flag in flags)
