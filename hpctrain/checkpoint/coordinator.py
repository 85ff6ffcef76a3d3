"""Rank 0's side of the save plan (:mod:`hpctrain.checkpoint.saveplan`): the plan made from
every rank's structure, each rank's part of it, and the tables that compare a save's
fingerprints, kept for the saves that reuse the plan.

Ranks holding the same structure (in a data-parallel job: every replica of a tp x pp
coordinate) form one group: a structure is decoded once per group, the plan walks the
groups (:func:`replicas.plan_writes`), and a group's answer is made once and sent to each
of its ranks. What grows with the world size here is linear: the gathers' bytes, one part
and one answer per rank, the fingerprints of a save compared in numpy.
"""

from __future__ import annotations

import pickle
import secrets
from collections.abc import Sequence

import numpy as np

from hpctrain.checkpoint import replicas, storage
from hpctrain.checkpoint.replicas import Key
from hpctrain.checkpoint.saveplan import WORD, decode_structure

FAULT = "coordinator-plan"   # storage.fault's point: the coordinator dies while it plans


def plan(contributions: list[bytes]) -> tuple[list[bytes], Coordinator | None]:
    """Every rank's part of a new plan, and the coordinator that keeps it; never raises:
    when planning fails every rank gets the error as its part (and None is kept)."""
    try:
        storage.fault(FAULT)
        coordinator = Coordinator(contributions)
        return coordinator.parts(), coordinator
    except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or they hang
        return _to_all(len(contributions), ("error", f"{type(exc).__name__}: {exc}")), None


def settle(made: Coordinator | None, messages: list[bytes]) -> list[bytes]:
    """Every rank's answer to this save's fingerprints (``made``: the coordinator of the
    plan in use); never raises: a failure reaches every rank as its answer."""
    try:
        if made is None:
            raise RuntimeError("rank 0 holds no plan to compare the fingerprints with")
        return made.answers(messages)
    except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or they hang
        return _to_all(len(messages), ("error", f"{type(exc).__name__}: {exc}"))


def _to_all(world: int, message: tuple) -> list[bytes]:
    blob = pickle.dumps(message, protocol=5)
    return [blob] * world


def cpus_per_rank(nodes: Sequence[tuple[str, Sequence[int]]]) -> list[float]:
    """Each rank's CPUs per rank on its node: the CPUs its node's ranks may use (together)
    over how many ranks the node runs. ``nodes[r]`` is rank r's (host, CPUs)."""
    cpus: dict[str, set[int]] = {}
    ranks: dict[str, int] = {}
    for host, mine in nodes:
        cpus.setdefault(host, set()).update(mine)
        ranks[host] = ranks.get(host, 0) + 1
    return [len(cpus[host]) / ranks[host] for host, _ in nodes]


class Coordinator:
    """The plan of one set of structures, and what answers a save's fingerprints."""

    def __init__(self, contributions: list[bytes]) -> None:
        digests, nodes, blobs = zip(*(pickle.loads(c) for c in contributions))
        members: dict[bytes, list[int]] = {}
        for rank, digest in enumerate(digests):
            members.setdefault(digest, []).append(rank)
        self.ranks = list(members.values())                      # per group
        self.structures = [decode_structure(blobs[r[0]]) for r in self.ranks]
        self.group_of = np.empty(len(digests), dtype=np.int64)
        for g, ranks in enumerate(self.ranks):
            self.group_of[ranks] = g
        self.plan = replicas.plan_writes([(items, ranks) for (items, _), ranks
                                          in zip(self.structures, self.ranks)])
        self.alongside = [c >= 2 for c in cpus_per_rank(nodes)]
        self.token = secrets.randbits(62) + 1
        self._fingerprint_tables()

    def _fingerprint_tables(self) -> None:
        """Ids of the fingerprinted values (plain chunks by key, extras by path) in each
        group's order, and every rank's laid end to end for :class:`replicas.Agreement`."""
        ids: dict[tuple, int] = {}
        by_group = []
        for items, extras in self.structures:
            mine = [ids.setdefault(("chunk", key), len(ids))
                    for key, _, sharded in items if not sharded]
            mine += [ids.setdefault(("extra", path), len(ids)) for path in extras]
            by_group.append(np.array(mine, dtype=np.int32))
        self.names = list(ids)
        counts = np.array([len(by_group[g]) for g in self.group_of], dtype=np.int64)
        self.width = 1 + int(counts.max(initial=0))                # words per message
        self.valid = np.arange(self.width - 1)[None, :] < counts[:, None]
        self.agreement = replicas.Agreement([by_group[g] for g in self.group_of])

    def parts(self) -> list[bytes]:
        """Each rank's part: the token, whether to fingerprint alongside, a bit per chunk
        it holds (set: it writes it first), the size of the fingerprint messages."""
        owned: dict[int, list[Key]] = {}
        for key, rank in self.plan.owner.items():
            owned.setdefault(rank, []).append(key)
        bases, where = [], []
        for items, _ in self.structures:
            bases.append(np.array([key in self.plan.per_rank for key, _, _ in items],
                                  dtype=bool))
            where.append({key: i for i, (key, _, _) in enumerate(items)})
        out = []
        for rank, g in enumerate(self.group_of.tolist()):
            flags = bases[g].copy()
            for key in owned.get(rank, ()):
                flags[where[g][key]] = True
            out.append(pickle.dumps(("ok", self.token, self.alongside[rank],
                                     np.packbits(flags).tobytes(),
                                     self.width * WORD.itemsize), protocol=5))
        return out

    def answers(self, messages: list[bytes]) -> list[bytes]:
        """Each rank's answer to a save's fingerprint messages: a bit per chunk it holds
        (set: its own value, written by it) and the extras' paths that differ by rank;
        "failed" to all when a rank could not send its fingerprints."""
        words = np.frombuffer(b"".join(messages), dtype=WORD).reshape(len(messages), -1)
        if not words[:, 0].all():
            return _to_all(len(messages), ("failed",))
        differ = [self.names[i] for i in self.agreement.differing(words[:, 1:][self.valid])]
        own = self.plan.per_rank | {name for kind, name in differ if kind == "chunk"}
        extras = sorted((name for kind, name in differ if kind == "extra"), key=repr)
        by_group = [pickle.dumps(("ok", np.packbits(np.array([key in own for key, _, _ in items],
                                                             dtype=bool)).tobytes(), extras),
                                 protocol=5)
                    for items, _ in self.structures]
        return [by_group[g] for g in self.group_of.tolist()]
