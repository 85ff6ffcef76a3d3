"""The requeue budget: the spec's limits and the arithmetic that judges a requeue against
them. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hpctrain.protocol import defaults

REQUEUE_CAUSES = ("preemption", "time_limit", "node_fail", "user_crash", "storage", "hang",
                  "health_check", "requeued")
# requeues that do not count against max_requeues: the site's node check failed, not the job
FREE_CAUSES = ("health_check",)
LIMIT_NAMES = {"preemption": "max_preemptions", "time_limit": "max_time_limits",
               "node_fail": "max_node_failures", "user_crash": "max_crash_restarts",
               "storage": "max_storage_retries", "hang": "max_hangs"}


# a crash's recoveries when the spec leaves max_crash_restarts out: a script that wraps its
# main in hpctrain.runtime.run asked to survive a crash, and a transient one (a flaky node,
# a filesystem hiccup) rarely strikes thrice; the same error at the same step twice ends it
# sooner (table.py, ``repeated_crash``). A plain script's crash is a bug until told otherwise
CRASH_RESTARTS_RUN = 3
CRASH_RESTARTS_PLAIN = 0


@dataclass(frozen=True)
class Budget:
    """The spec's requeue limits: the total, and one per cause (``requeued``, somebody's
    ``scontrol requeue``, counts for the total only). A cause left out of ``per_cause``
    takes ``max_requeues``, but a crash its own default (:meth:`limit_of`)."""

    max_requeues: int = defaults.MAX_REQUEUES
    per_cause: Mapping[str, int] = field(default_factory=dict)  # cause -> limit

    def limit_of(self, cause: str, wrapped: bool = False) -> tuple[str, int] | None:
        """(``max_preemptions``, 2) for a cause with its own limit; None for ``requeued``.
        ``wrapped``: the step's script runs under ``hpctrain.runtime.run``, whose crashes
        are retried by default (CRASH_RESTARTS_RUN), a plain script's not."""
        name = LIMIT_NAMES.get(cause)
        if name is None:
            return None
        if cause in self.per_cause:
            return name, self.per_cause[cause]
        if cause == "user_crash":
            return name, CRASH_RESTARTS_RUN if wrapped else CRASH_RESTARTS_PLAIN
        return name, self.max_requeues

    @property
    def crash_default(self) -> bool:
        """Did the spec leave ``max_crash_restarts`` out? Then the default's rule of a
        repeated crash applies; a number given overrides both."""
        return "user_crash" not in self.per_cause


def counted(restart: int, requeues: Mapping[str, int]) -> int:
    """Restart number ``restart`` as ``max_requeues`` counts it: free requeues left out."""
    return restart - sum(requeues.get(c, 0) for c in FREE_CAUSES)


def over_limit(budget: Budget, cause: str, count: int, restart: int,
               wrapped: bool = False) -> str | None:
    """The limit that forbids restart number ``restart`` when it is requeue number ``count``
    of ``cause`` (``max_preemptions=2``), or None when the budget allows it."""
    if restart > budget.max_requeues:
        return f"max_requeues={budget.max_requeues}"
    limit = budget.limit_of(cause, wrapped)
    if limit is not None and count > limit[1]:
        return f"{limit[0]}={limit[1]}"
    return None


def limit_text(limit: str, cause: str, count: int, restart: int) -> str:
    """``max_preemptions=1 reached (this is preemption requeue 2)``."""
    if limit.startswith("max_requeues="):
        return f"{limit} reached (this is restart {restart})"
    what = "recovery (in place or requeue)" if cause == "user_crash" else "requeue"
    return f"{limit} reached (this is {cause} {what} {count})"


def budget_text(budget: Budget, cause: str, count: int, restart: int,
                wrapped: bool = False) -> str:
    """``restart 2 of max_requeues=10, preemption requeue 1 of max_preemptions=10``."""
    text = f"restart {restart} of max_requeues={budget.max_requeues}"
    limit = budget.limit_of(cause, wrapped)
    if limit is not None:
        what = "recovery (in place or requeue)" if cause == "user_crash" else "requeue"
        text += f", {cause} {what} {count} of {limit[0]}={limit[1]}"
    return text
