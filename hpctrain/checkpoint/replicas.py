"""Which saved values are shared by ranks and which belong to one rank: decided from what
every rank actually holds, never assumed (pure: no torch, no I/O).

A plain tensor (not a DTensor) may be a replica (DDP's parameters: written once) or a
rank's own value (its RNG state, a pipeline stage's raw optimizer state): saving one rank's
copy for all of them would silently give every rank another rank's values on load. So each
rank reports a fingerprint (size and crc32 of the bytes) of every plain tensor and of every
extra; values whose holders agree are *shared* and written once, values whose holders
disagree are *per rank* and every holder writes its own. A DTensor shard's placement
already says what it is (no fingerprint).

So that the checksumming overlaps the disk, a save starts from a *provisional* plan made
from sizes alone (:func:`plan_writes` with no fingerprints: each value held at one size by
several ranks is given to one owner, who starts writing it), and :func:`settle` makes it
final once the fingerprints are in: a value found to differ stays written as its
provisional owner's own, and its other holders add theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Key = tuple                 # a chunk's (path, offsets)
Held = tuple                # (key, nbytes, fingerprint or None for a DTensor shard)


@dataclass(frozen=True)
class WritePlan:
    """Who writes which chunk."""

    owner: dict[Key, int]          # a shared chunk -> the one rank that writes it
    per_rank: frozenset[Key]       # chunks every holder writes as its own

    def writes(self, rank: int, key: Key) -> bool:
        return key in self.per_rank or self.owner.get(key) == rank


def plan_writes(held: Sequence[Sequence[Held]]) -> WritePlan:
    """The write plan from every rank's (key, nbytes, fingerprint) list (index = rank).

    A shared chunk is written by the holder with the fewest bytes so far, so the ranks
    write about equal amounts in parallel. Deterministic: every rank computes the same plan.
    """
    holders: dict[Key, list[int]] = {}
    size: dict[Key, int] = {}
    prints: dict[Key, set] = {}
    for rank, items in enumerate(held):
        for key, nbytes, fingerprint in items:
            holders.setdefault(key, []).append(rank)
            size[key] = nbytes
            prints.setdefault(key, set()).add((nbytes, fingerprint))
    per_rank = frozenset(k for k, fps in prints.items() if len(fps) > 1)
    load = [0] * len(held)
    for key in per_rank:
        for rank in holders[key]:
            load[rank] += size[key]
    owner: dict[Key, int] = {}
    for key in sorted(set(holders) - per_rank, key=lambda k: (-size[k], repr(k))):
        rank = min(holders[key], key=lambda r: (load[r], r))
        owner[key] = rank
        load[rank] += size[key]
    return WritePlan(owner, per_rank)


def settle(provisional: WritePlan, held: Sequence[Sequence[Held]]) -> WritePlan:
    """The final plan once every rank's fingerprints are known, for a save whose writes
    began on ``provisional`` (a plan made from sizes alone, every fingerprint None): a value
    whose holders disagree becomes per rank (each holder writes its own; the copy its
    provisional owner has already written becomes that owner's own), and every other
    shared value keeps its provisional owner, who has written it."""
    per_rank = plan_writes(held).per_rank
    owner = {k: r for k, r in provisional.owner.items() if k not in per_rank}
    return WritePlan(owner, per_rank | provisional.per_rank)


def differing(held: Sequence[dict[tuple, int]]) -> list[tuple]:
    """Paths (of extras) whose fingerprint differs between the ranks holding them, sorted."""
    seen: dict[tuple, set[int]] = {}
    for prints in held:
        for path, fingerprint in prints.items():
            seen.setdefault(path, set()).add(fingerprint)
    return sorted((p for p, fps in seen.items() if len(fps) > 1), key=repr)


def overlaps(a: tuple, b: tuple) -> bool:
    """Is one key path a prefix of the other (the same value, or inside it)?"""
    n = min(len(a), len(b))
    return a[:n] == b[:n]
