"""The save plan, made once at a coordinator and kept while nothing changes: each rank's
side (its structure, its part of the plan and the cache that keeps it, its fingerprint
message); the collectives that carry them are :mod:`hpctrain.checkpoint.exchange`'s.

A rank's *structure* is what the plan depends on: the key, byte count and kind (plain or
DTensor shard) of every chunk it holds, the paths of its extras, its node and CPUs. The
plan itself (who writes which shared chunk first; :func:`replicas.plan_writes`) is made
by rank 0, the coordinator (:mod:`hpctrain.checkpoint.coordinator`), from one gather of
every rank's structure, and each rank gets its own part back (one scatter). A later save
of the same structures costs one all-reduce of three numbers (did any rank's structure
change? do all ranks hold the same plan?); any change, on any rank, plans again.

Values change between saves, so the per-rank rule is still checked at every save: each
rank sends the coordinator its fingerprints (one checksum per plain chunk and extra, in
its structure's order: O(its own values)), and gets back which of its values are its own
this time (O(1) bytes in the usual case). No rank but the coordinator receives anything
that grows with the world size; the coordinator's work grows linearly.
"""

from __future__ import annotations

import hashlib
import pickle
import zlib
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from hpctrain.checkpoint.replicas import Item, Key
from hpctrain.errors import CheckpointError

WORD = np.dtype("<u4")   # a fingerprint (a 32-bit checksum) in the exchange's messages


class PlanFailed(CheckpointError):
    """The coordinator could not make (or settle) the plan; every rank raises it."""


@dataclass
class Structure:
    """One rank's save as the plan sees it (values aside)."""

    items: list[Item]                        # (key, nbytes, sharded) per chunk, in order
    extras: list[tuple]                      # the extras' paths, in order
    node: tuple[str, tuple[int, ...]]        # host, the CPUs this process may use

    @classmethod
    def of(cls, chunks: list, extras: list[tuple], node: tuple[str, Any]) -> Structure:
        items = [((c.path, c.offsets), c.nbytes, c.sharded) for c in chunks]
        return cls(items, list(extras), (node[0], tuple(sorted(node[1]))))

    @cached_property
    def _pickled(self) -> bytes:
        return pickle.dumps((self.items, self.extras), protocol=5)

    @cached_property
    def digest(self) -> bytes:
        """Equal on two ranks (or two saves) exactly when the items and extras are."""
        return hashlib.blake2b(self._pickled, digest_size=16).digest()

    def contribution(self) -> bytes:
        """What the planning gather carries: the digest (ranks of one structure are
        planned as one group), the node, the structure compressed (a model's key paths
        repeat: 5-10x smaller)."""
        return pickle.dumps((self.digest, self.node, zlib.compress(self._pickled, 1)),
                            protocol=5)

    @property
    def fingerprinted(self) -> int:
        """How many checksums this rank sends per save: its plain chunks, its extras."""
        return sum(1 for _, _, sharded in self.items if not sharded) + len(self.extras)


def decode_structure(blob: bytes) -> tuple[list[Item], list[tuple]]:
    """A contribution's compressed structure, back (the coordinator's side)."""
    return pickle.loads(zlib.decompress(blob))


@dataclass(frozen=True)
class RankPlan:
    """This rank's part of the plan: what it writes before the fingerprints are compared,
    and which of its values are its own (by structure; once settled, by value too)."""

    token: int                    # the plan's id: every rank holds the same one
    first: frozenset[Key]         # shared chunks it owns, and its own by structure
    per_rank: frozenset[Key]      # its values that differ from their other holders'
    alongside: bool               # fingerprint on a second thread (a CPU to spare per rank)
    message: int                  # bytes of every rank's fingerprint message

    def writes(self, key: Key) -> bool:
        return key in self.first or key in self.per_rank


class PlanCache:
    """A manager's plan, kept between its saves; on rank 0 also the coordinator's tables
    (:class:`hpctrain.checkpoint.coordinator.Coordinator`)."""

    def __init__(self) -> None:
        self.key: tuple | None = None        # (structure digest, node) it was made for
        self.plan: RankPlan | None = None
        self.coordinator: Any = None
        self.plans = self.hits = 0           # how many saves planned, how many reused

    def vote(self, structure: Structure) -> list[int]:
        """This rank's part of the agreement: [changed, token, -token] (all-reduced by
        maximum: nobody changed, and the tokens' maximum equals their minimum)."""
        same = self.plan is not None and self.key == (structure.digest, structure.node)
        token = self.plan.token if self.plan is not None else 0
        return [0 if same else 1, token, -token]

    def reused(self, votes: list[int]) -> RankPlan | None:
        """The kept plan, when the all-reduced ``votes`` say that every rank holds it and
        no rank's structure changed; else None (plan again)."""
        if votes[0] == 0 and votes[1] == -votes[2] and self.plan is not None:
            self.hits += 1
            return self.plan
        return None

    def clear(self) -> None:
        self.key, self.plan, self.coordinator = None, None, None

    def adopt(self, structure: Structure, part: bytes, made: Any = None) -> RankPlan:
        """Keep the part of a new plan the coordinator sent (and on rank 0 the coordinator
        ``made``, which answers for it); PlanFailed if it sent its error instead (every
        rank gets the same)."""
        self.clear()
        kind, *rest = pickle.loads(part)
        if kind != "ok":
            raise PlanFailed(f"the save plan failed on rank 0 (the coordinator): {rest[0]}")
        token, alongside, first, message = rest
        # its own values are known once the fingerprints are compared (settled)
        self.plan = RankPlan(token, frozenset(_selected(structure.items, first)), frozenset(),
                             alongside, message)
        self.key, self.coordinator = (structure.digest, structure.node), made
        self.plans += 1
        return self.plan

    def settled(self, plan: RankPlan, answer: bytes,
                structure: Structure) -> tuple[RankPlan, list[tuple]] | None:
        """The final plan and the extras' paths that differ by rank, from the coordinator's
        answer to this save (of ``structure``, the plan's); None when a rank failed before
        it sent its fingerprints (its own error fails the commit); PlanFailed when the
        coordinator failed."""
        kind, *rest = pickle.loads(answer)
        if kind == "failed":
            return None
        if kind != "ok":
            self.clear()
            raise PlanFailed(f"the save plan failed on rank 0 (the coordinator): {rest[0]}")
        own_bits, own_extras = rest
        return replace(plan, per_rank=frozenset(_selected(structure.items, own_bits))), \
            own_extras


def _selected(items: list[Item], bits: bytes) -> list[Key]:
    """The keys of the items whose bit is set (``bits``: numpy's packbits over the items,
    in order)."""
    flags = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), count=len(items))
    return [items[i][0] for i in np.flatnonzero(flags)]


def fingerprint_message(prints: list[int] | None, size: int) -> bytes:
    """A rank's fingerprint message: a status word (1: sent; 0: this rank failed before it
    could fingerprint) and its checksums, padded to the ``size`` every rank sends."""
    words = np.zeros(size // WORD.itemsize, dtype=WORD)
    if prints is not None:
        words[0] = 1
        words[1:1 + len(prints)] = prints
    return words.tobytes()
