"""The requeue budget: the spec's limits and the arithmetic that judges a requeue against
them. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

REQUEUE_CAUSES = ("preemption", "time_limit", "node_fail", "user_crash", "storage", "hang",
                  "health_check", "requeued")
# requeues that do not count against max_requeues: the site's node check failed, not the job
FREE_CAUSES = ("health_check",)
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


def counted(restart: int, requeues: Mapping[str, int]) -> int:
    """Restart number ``restart`` as ``max_requeues`` counts it: free requeues left out."""
    return restart - sum(requeues.get(c, 0) for c in FREE_CAUSES)


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
