"""The planner's question and its search space (pure): what the user asked
(:class:`Request`), the node counts to try, and every candidate layout in them, ranked.

Both :func:`hpctrain.planner.core.recommend` and the advice for a workload that fits
nowhere (:mod:`hpctrain.planner.advice`, which re-plans with changed requests) search here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpctrain.errors import PlanError
from hpctrain.planner.candidates import Candidate, Hardware, enumerate_candidates, node_counts
from hpctrain.planner.cost import DEFAULT_MFU
from hpctrain.planner.memory import Workload

DEFAULT_MAX_NODES = 64  # without a partition's max_nodes or --max-nodes


@dataclass(frozen=True)
class Request:
    """What the user asked: the workload and the limits of the search."""

    workload: Workload
    nodes: int | None = None        # exactly this many nodes
    max_nodes: int | None = None    # or any count up to this
    zero: int | None = None         # None: the planner picks per layout
    recompute: str | None = None    # None: the planner picks per layout
    tokens: float | None = None
    price_per_gpu_hour: float | None = None
    mfu: float = DEFAULT_MFU


def node_range(req: Request, hw: Hardware) -> tuple[int, int]:
    """The node counts to search, checked against the partition's limit."""
    for flag, value in (("--nodes", req.nodes), ("--max-nodes", req.max_nodes)):
        if value is not None and value < 1:
            raise PlanError(f"{flag}={value} must be >= 1")
        if value is not None and hw.max_nodes is not None and value > hw.max_nodes:
            raise PlanError(f"{flag}={value} exceeds partition {hw.partition!r}'s "
                            f"max_nodes={hw.max_nodes}: ask for at most {hw.max_nodes} nodes "
                            "or choose another partition")
    if req.nodes is not None and req.max_nodes is not None:
        raise PlanError("give --nodes N (exactly N nodes) or --max-nodes N (up to N), not both")
    if req.nodes is not None:
        return req.nodes, req.nodes
    return 1, req.max_nodes or hw.max_nodes or DEFAULT_MAX_NODES


def search(req: Request, hw: Hardware) -> list[Candidate]:
    """Every candidate in the request's node range, ranked."""
    low, high = node_range(req, hw)
    return enumerate_candidates(req.workload, hw, node_counts(low, high), req.zero, req.recompute)


def with_changes(req: Request, **changes: object) -> Request:
    """``req`` with workload or search fields replaced (used by the advice)."""
    wl = {k: v for k, v in changes.items() if k in Workload.__dataclass_fields__}
    rest = {k: v for k, v in changes.items() if k not in wl}
    return replace(req, workload=replace(req.workload, **wl), **rest)
