"""Enumerate the layouts a job could use and rank them.

tp stays inside a node (it divides the GPUs per node, and the heads); pp divides the
layers; dp takes the rest. A single-node job may use part of a node (any divisor of
its GPUs), a multi-node job uses whole nodes. For each (nodes, tp, pp, dp) the planner
picks the ZeRO stage and recomputation with the best efficiency that fits (the user
may pin either); ZeRO stages 2 and 3 are not combined with pp > 1 (DeepSpeed does not
support it; Megatron's distributed optimizer is stage 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from hpctrain.mesh import divisors
from hpctrain.planner.memory import RECOMPUTE, Breakdown, Parallelism, Workload, breakdown
from hpctrain.planner.scaling import Curve, efficiency
from hpctrain.planner.sizes import GB


@dataclass(frozen=True)
class Hardware:
    """The GPU facts the planner needs, from a partition or from the command line."""

    gpus_per_node: int
    gpu_mem_gb: float
    gpu_peak_tflops: float
    curve: Curve
    max_nodes: int | None = None
    partition: str | None = None


@dataclass(frozen=True)
class Candidate:
    """One layout on ``nodes`` nodes using ``gpus_per_node`` GPUs on each."""

    nodes: int
    gpus_per_node: int
    layout: Parallelism
    memory: Breakdown
    capacity: float  # bytes per GPU
    efficiency: dict[str, float]

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.capacity

    def rank_key(self) -> tuple[float, ...]:
        """Fewest GPUs first, fitting before not, then highest efficiency, then least memory."""
        return (self.gpus, 0 if self.fits else 1, -round(self.efficiency["total"], 6),
                self.memory.total)


def node_counts(low: int, high: int) -> list[int]:
    """Every count up to 32, then powers of two, and ``high`` itself (keeps plans instant)."""
    counts = {n for n in range(low, min(high, 32) + 1)}
    counts |= {2**k for k in range(5, 20) if low <= 2**k <= high}
    return sorted(counts | {high})


def _settings(w: Workload, pp: int, dp: int, zero: int | None,
              recompute: str | None) -> Iterator[tuple[int, str]]:
    if w.mode == "inference":
        yield 0, "none"
        return
    if zero is not None:
        zeros: Sequence[int] = [zero] if (pp == 1 or zero <= 1) else []
    else:  # with dp == 1 there is nothing to shard: every stage is stage 0
        zeros = [0] if dp == 1 else ([0, 1, 2, 3] if pp == 1 else [0, 1])
    for z in zeros:
        for r in [recompute] if recompute else RECOMPUTE:
            yield z, r


def best_per_layout(w: Workload, hw: Hardware, nodes: int, zero: int | None,
                    recompute: str | None) -> Iterator[Candidate]:
    """The best setting of each (tp, pp, dp) on exactly ``nodes`` nodes."""
    per_node = divisors(hw.gpus_per_node) if nodes == 1 else [hw.gpus_per_node]
    capacity = hw.gpu_mem_gb * GB
    for g in per_node:
        world = nodes * g
        for tp in divisors(g):
            if w.arch.heads % tp:
                continue
            for pp in divisors(w.arch.layers):
                if (world // tp) % pp:
                    continue
                dp = world // (tp * pp)
                options = [Candidate(nodes, g, lay, breakdown(w, lay), capacity,
                                     efficiency(lay, g, nodes, hw.curve))
                           for z, r in _settings(w, pp, dp, zero, recompute)
                           for lay in [Parallelism(tp, pp, dp, z, r)]]
                if not options:
                    continue
                fitting = [c for c in options if c.fits]
                if fitting:  # best efficiency, then the lowest ZeRO stage, then least memory
                    yield min(fitting, key=lambda c: (-round(c.efficiency["total"], 6),
                                                      c.layout.zero, c.memory.total))
                else:
                    yield min(options, key=lambda c: c.memory.total)


def enumerate_candidates(w: Workload, hw: Hardware, counts: Sequence[int],
                         zero: int | None, recompute: str | None) -> list[Candidate]:
    """Every layout on every node count in ``counts``, ranked (see :meth:`Candidate.rank_key`)."""
    found = [c for n in counts for c in best_per_layout(w, hw, n, zero, recompute)]
    return sorted(found, key=Candidate.rank_key)
