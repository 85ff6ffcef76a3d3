"""Who is who in a tp x dp x pp layout: pure rank arithmetic, importable anywhere.

Global rank order is Megatron's: **tp fastest, then dp, then pp**::

    rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

Kept apart from hpctrain.spec.layout (which checks a job spec against a partition) so that
in-job code (hpctrain.runtime) uses the very same numbering without importing
submission code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hpctrain.errors import LayoutError


class Coords(NamedTuple):
    """Where one rank sits in the layout."""

    pp: int
    dp: int
    tp: int


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending: the degrees a dimension of ``n`` can split into."""
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_degrees(tp: int, dp: int, pp: int) -> None:
    for key, value in (("tp", tp), ("dp", dp), ("pp", pp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LayoutError(f"{key}={value!r} must be a whole number >= 1")


def rank_to_coords(rank: int, tp: int, dp: int, pp: int) -> Coords:
    """(pp_rank, dp_rank, tp_rank) of global ``rank``: tp fastest, then dp, then pp."""
    _check_degrees(tp, dp, pp)
    world = tp * dp * pp
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise LayoutError(f"rank={rank!r} is outside world={world} (tp={tp} x dp={dp} x "
                          f"pp={pp}): use 0..{world - 1}")
    return Coords(pp=rank // (tp * dp), dp=(rank // tp) % dp, tp=rank % tp)


def coords_to_rank(pp_rank: int, dp_rank: int, tp_rank: int, tp: int, dp: int, pp: int) -> int:
    """Global rank of the given coordinates; the inverse of :func:`rank_to_coords`."""
    _check_degrees(tp, dp, pp)
    for key, value, size in (("pp_rank", pp_rank, pp), ("dp_rank", dp_rank, dp),
                             ("tp_rank", tp_rank, tp)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
            raise LayoutError(f"{key}={value!r} is outside 0..{size - 1}")
    return (pp_rank * dp + dp_rank) * tp + tp_rank


@dataclass(frozen=True)
class Mesh:
    """A tp x dp x pp decomposition of ``world`` ranks."""

    tp: int
    dp: int
    pp: int

    @property
    def world(self) -> int:
        return self.tp * self.dp * self.pp

    def coords(self, rank: int) -> Coords:
        return rank_to_coords(rank, self.tp, self.dp, self.pp)

    def rank(self, coords: Coords) -> int:
        return coords_to_rank(coords.pp, coords.dp, coords.tp, self.tp, self.dp, self.pp)

    def tp_group(self, rank: int) -> list[int]:
        """The ranks sharing ``rank``'s tensor-parallel group (consecutive ranks)."""
        c = self.coords(rank)
        return [self.rank(Coords(c.pp, c.dp, t)) for t in range(self.tp)]

    def dp_group(self, rank: int) -> list[int]:
        c = self.coords(rank)
        return [self.rank(Coords(c.pp, d, c.tp)) for d in range(self.dp)]

    def pp_group(self, rank: int) -> list[int]:
        c = self.coords(rank)
        return [self.rank(Coords(p, c.dp, c.tp)) for p in range(self.pp)]


# ---- shrinking the data-parallel width ([elastic] min_nodes) --------------------------------
def shrink_widths(nodes: int, min_nodes: int, gpus_per_node: int, tp: int, pp: int) -> list[int]:
    """The node counts, largest first, below ``nodes`` and at least ``min_nodes``, a step of
    this layout may shrink to: whole model-parallel groups (``tp * pp`` ranks each) and a
    data-parallel width that divides the full one, so that a whole accumulation keeps the
    global batch (dp 4 -> 2: two micro-batches a step; dp 6 -> 4 is not offered)."""
    group = tp * pp
    full_dp = nodes * gpus_per_node // group
    out = []
    for n in range(nodes - 1, max(min_nodes, 1) - 1, -1):
        ranks = n * gpus_per_node
        if ranks % group == 0 and full_dp % (ranks // group) == 0:
            out.append(n)
    return out


def source_rank(rank: int, tp: int, dp: int, pp: int, full_dp: int) -> int:
    """The rank of the full-width layout whose state ``rank`` of a shrunk one (``dp`` of
    ``full_dp`` replicas) takes: the same pipeline stage and tensor slice of the replica
    with the same data-parallel index (the replicas hold the same model and optimizer)."""
    c = rank_to_coords(rank, tp, dp, pp)
    return coords_to_rank(c.pp, c.dp, c.tp, tp, full_dp, pp)
