"""Which saved values are shared by ranks and which belong to one rank: decided from what
every rank actually holds, never assumed (pure: no torch, no I/O).

A plain tensor (not a DTensor) may be a replica (DDP's parameters: written once) or a
rank's own value (its RNG state, a pipeline stage's raw optimizer state): saving one rank's
copy for all of them would silently give every rank another rank's values on load. So each
rank reports a fingerprint (size and checksum of the bytes) of every plain tensor and of
every extra; values whose holders agree are *shared* and written once, values whose holders
disagree are *per rank* and every holder writes its own. A DTensor shard's placement
already says what it is (no fingerprint).

So that the checksumming overlaps the disk, a save starts from a *provisional* plan made
from the ranks' structures alone (:func:`plan_writes`: each value held at one size by
several ranks is given to one owner, who starts writing it); the fingerprints, compared
once they are in (:func:`differing`), settle it: a value found to differ stays written as
its provisional owner's own, and its other holders add theirs. The plan is made once, at a
coordinator, and reused while the structures stay the same
(:mod:`hpctrain.checkpoint.saveplan`); the fingerprints are compared at every save.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Key = tuple                 # a chunk's (path, offsets)
Item = tuple                # (key, nbytes, sharded): one chunk of a rank's structure


@dataclass(frozen=True)
class WritePlan:
    """Who writes which chunk, job-wide (the coordinator's; a rank keeps its own part)."""

    owner: dict[Key, int]          # a shared chunk -> the one rank that writes it
    per_rank: frozenset[Key]       # chunks every holder writes as its own

    def writes(self, rank: int, key: Key) -> bool:
        return key in self.per_rank or self.owner.get(key) == rank


def plan_writes(groups: Sequence[tuple[Sequence[Item], Sequence[int]]]) -> WritePlan:
    """The provisional plan from every distinct structure and the ranks holding it:
    ``groups[g] = (items, ranks)``, every rank in exactly one group.

    A chunk its holders hold at different sizes (or sharded on one, plain on another) is
    per rank; every other chunk is written by the holder with the fewest bytes so far
    (per-rank chunks counted first), largest chunks first, so the ranks write about equal
    amounts in parallel. Ties go to the lowest rank: deterministic. Each group keeps its
    ranks in a heap by load, so a chunk costs a look at the top of each group holding it,
    not at every holder: the plan of 16,384 ranks in 64 structures takes what 64 would.
    """
    holders: dict[Key, list[int]] = {}
    kinds: dict[Key, set[tuple[int, bool]]] = {}
    for g, (items, _ranks) in enumerate(groups):
        for key, nbytes, sharded in items:
            holders.setdefault(key, []).append(g)
            kinds.setdefault(key, set()).add((nbytes, bool(sharded)))
    per_rank = frozenset(k for k, seen in kinds.items() if len(seen) > 1)
    heaps = []
    for items, ranks in groups:
        own = sum(n for key, n, _ in items if key in per_rank)
        heap = [(own, r) for r in ranks]
        heapq.heapify(heap)
        heaps.append(heap)
    size = {k: next(iter(seen))[0] for k, seen in kinds.items() if k not in per_rank}
    owner: dict[Key, int] = {}
    for key in sorted(size, key=lambda k: (-size[k], repr(k))):
        best = min((heaps[g] for g in holders[key]), key=lambda h: h[0])
        load, rank = best[0]
        heapq.heapreplace(best, (load + size[key], rank))
        owner[key] = rank
    return WritePlan(owner, per_rank)


class Agreement:
    """Which fingerprinted values differ between their holders, for one set of structures:
    built once per plan (the ids of every rank's fingerprinted values, in rank order, and
    their order by id), then :meth:`differing` costs two passes over the fingerprints of a
    save, in numpy, however many ranks send them."""

    def __init__(self, ids_by_rank: Sequence[np.ndarray]) -> None:
        self.counts = np.array([len(ids) for ids in ids_by_rank], dtype=np.int64)
        ids = np.concatenate(ids_by_rank) if len(ids_by_rank) else np.zeros(0, np.int64)
        self.order = np.argsort(ids, kind="stable")
        ordered = ids[self.order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(ordered) \
            else np.zeros(0, np.int64)
        self.starts, self.ids = starts, ordered[starts]

    def differing(self, fingerprints: np.ndarray) -> np.ndarray:
        """The ids whose holders sent more than one value; ``fingerprints`` is every rank's
        values concatenated in rank order (as the ids were given)."""
        if not len(self.starts):
            return np.zeros(0, dtype=self.ids.dtype)
        values = fingerprints[self.order]
        low = np.minimum.reduceat(values, self.starts)
        high = np.maximum.reduceat(values, self.starts)
        return self.ids[low != high]


def overlaps(a: tuple, b: tuple) -> bool:
    """Is one key path a prefix of the other (the same value, or inside it)?"""
    n = min(len(a), len(b))
    return a[:n] == b[:n]
