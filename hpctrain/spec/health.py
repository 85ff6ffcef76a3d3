"""``[health]``: slow nodes (fail-slow faults), found from the ranks' own time per step and
acted on by policy (docs/fault-recovery.md, "Slow nodes")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.errors import SpecError
from hpctrain.protocol.defaults import SLOW_FACTOR, SLOW_FOR_S
from hpctrain.spec.checks import check_table

ON_SLOW = ("replace", "exclude", "report")


@dataclass(frozen=True)
class HealthSpec:
    """``on_slow``: what a node found slow gets: ``replace`` (by a spare, in the
    allocation), ``exclude`` (left out of the job's next start), ``report`` (the job log,
    ``status`` and ``report`` only); None: replace when the job has a spare, else report.
    A node is slow when its ranks' own time per step is ``slow_factor`` times the other
    nodes' for ``slow_for_s`` seconds. ``preflight``: before each run's first step, a
    matrix multiply timed on every node, and one far slower than the others left out when
    a spare can take its place (a few seconds a run)."""

    on_slow: str | None = None
    slow_factor: float = SLOW_FACTOR
    slow_for_s: float = SLOW_FOR_S
    preflight: bool = False      # time a GEMM on every node before each run's first step

    @classmethod
    def from_dict(cls, data: Any) -> "HealthSpec":
        d = check_table(data, "health", cls)
        on_slow = d.get("on_slow")
        if on_slow is not None and on_slow not in ON_SLOW:
            raise SpecError(f"health.on_slow={on_slow!r} must be one of {', '.join(ON_SLOW)} "
                            "(or left out: replace with a spare node, else report)")
        factor = d.get("slow_factor", SLOW_FACTOR)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or \
                not 1.1 <= factor <= 100:
            raise SpecError(f"health.slow_factor={factor!r} must be a number from 1.1 to 100 "
                            f"(a node this many times slower than the others is slow; "
                            f"{SLOW_FACTOR} by default)")
        for_s = d.get("slow_for_s", SLOW_FOR_S)
        if isinstance(for_s, bool) or not isinstance(for_s, (int, float)) or \
                not 2 <= for_s <= 86400:
            raise SpecError(f"health.slow_for_s={for_s!r} must be seconds from 2 to 86400 "
                            f"(how long a node must stay slow; {SLOW_FOR_S:g} by default)")
        preflight = d.get("preflight", False)
        if not isinstance(preflight, bool):
            raise SpecError(f"health.preflight={preflight!r} must be true or false (a matrix "
                            "multiply timed on every node before each run's first step)")
        return cls(on_slow=on_slow, slow_factor=float(factor), slow_for_s=float(for_s),
                   preflight=preflight)
