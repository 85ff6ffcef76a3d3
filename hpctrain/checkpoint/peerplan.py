"""Who keeps whose peer copy, and which step a load takes from where (pure: no sockets, no
files, no collectives), for :mod:`hpctrain.checkpoint.peers`.

A node's memory holds whole copies of snapshots, each of one rank's state at one step: a
rank's own two (its newest, and the newest its partner is known to hold) and, in two slots
each, its wards' (the ranks it is partner to). A load asks every node what it holds
(:class:`Held`, listed by the copies' own meta, not by who sits on the node now: torchrun
may give a restarted node other ranks) and restores the newest step for which *every*
rank has a whole copy somewhere: never a mix of steps. Each rank reads its copy from its
own node's memory when it is there, else one rank of the node that holds it sends it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

SHOWN = 4                             # ranks named in a line about what is missing
ONE_NODE = "the job runs on one node"  # why no copies: no partner node


def partners(hosts: Sequence[str]) -> list[int | None]:
    """Rank -> the rank that keeps its copy (``hosts[r]`` is rank r's node): the rank with
    the same local index on the next node, round the nodes; never one on its own node.
    None for every rank when the job runs on one node."""
    order = list(dict.fromkeys(hosts))
    if len(order) < 2:
        return [None] * len(hosts)
    on: dict[str, list[int]] = {h: [] for h in order}
    local: list[int] = []
    for rank, host in enumerate(hosts):
        local.append(len(on[host]))
        on[host].append(rank)
    after = {h: order[(i + 1) % len(order)] for i, h in enumerate(order)}
    return [on[after[h]][local[r] % len(on[after[h]])] for r, h in enumerate(hosts)]


class Pairing(NamedTuple):
    """One rank's part of the pairing: where its partner listens, its wards, whether it
    lists and tidies its node's copies at a load (the node's first rank), the ranks whose
    copies its node keeps (those on it and their wards), why copies are off ("")."""

    partner: tuple[str, int]
    wards: list[int]
    lister: bool
    keep: list[int]
    why: str


def assign(where: Sequence[tuple[str, int]], have_supervisor: bool,
           unsafe: str = "") -> list[Pairing]:
    """Rank 0's answer to every rank's (node, port), in rank order; ``unsafe``: why some
    node's directory for the copies is not provably the user's (copies off everywhere)."""
    nodes = [node for node, _ in where]
    plan = partners(nodes)
    why = ONE_NODE if plan and plan[0] is None else \
        "no supervisor (it removes the copies from node memory at the run's end)" \
        if not have_supervisor else unsafe
    wards: list[list[int]] = [[] for _ in where]
    for rank, partner in enumerate(plan):
        if partner is not None:
            wards[partner].append(rank)
    keep: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        keep.setdefault(node, []).extend([rank, *wards[rank]])
    first = {node: nodes.index(node) for node in keep}
    return [Pairing(where[p] if p is not None else ("", 0), wards[r], first[nodes[r]] == r,
                    sorted(keep[nodes[r]]), why) for r, p in enumerate(plan)]


class Held(NamedTuple):
    """A whole copy in a node's memory: whose state (``rank``), which ``step``, how many
    bytes it sends as, and its ``name`` in the node's directory (``R.i``: a rank's own
    buffer i, data and meta; ``W.a.copy``: a ward's slot)."""

    rank: int
    step: int
    size: int
    name: str


@dataclass
class Route:
    """One rank's part of a load: the ``step`` (None: none from memory), the copy it reads
    from its own node's memory (``local``: a name), or the rank it receives its copy from
    and its size (``receive``), the copy's ``source`` (node, name), and the copies it sends
    to others (rank, name, size)."""

    step: int | None
    source: tuple[str, str] = ("", "")
    local: str | None = None
    receive: tuple[int, int] | None = None
    sends: list[tuple[int, str, int]] = field(default_factory=list)


@dataclass
class Plan:
    """Rank 0's decision: every rank's :class:`Route`, and the line the job log gets."""

    routes: list[Route]
    line: str


def restore_plan(nodes: Sequence[str], held: Mapping[str, Sequence[Held]],
                 durable: int | None, sources: Sequence[int] | None = None) -> Plan:
    """The newest step, no older than the ``durable`` step, of which every rank (rank r on
    ``nodes[r]`` now) has a whole copy in some node's memory (``held``: node -> its
    copies), and where each rank's comes from; or none, with why in the line.
    ``sources``: the rank whose copy each rank takes (a step shrunk to fewer data-parallel
    replicas: :func:`hpctrain.mesh.source_rank`); left out, its own."""
    world = len(nodes)
    source = list(sources) if sources is not None else list(range(world))
    wanted = set(source)
    where: dict[tuple[int, int], dict[str, Held]] = {}    # (rank, step) -> node -> copy
    for node, copies in held.items():
        for c in copies:
            if c.rank in wanted:
                where.setdefault((c.rank, c.step), {})[node] = c
    steps = sorted({s for _, s in where}, reverse=True)
    for step in steps:
        if durable is not None and step < durable:
            break
        if all((source[r], step) in where for r in range(world)):
            return _routes(nodes, {r: where[(source[r], step)] for r in range(world)}, step,
                           durable)
    return Plan([Route(None) for _ in nodes], _why_none(source, where, steps, durable))


def _routes(nodes: Sequence[str], sources: Mapping[int, Mapping[str, Held]], step: int,
            durable: int | None) -> Plan:
    on: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        on.setdefault(node, []).append(rank)
    routes = [Route(step) for _ in nodes]
    load = {r: 0 for r in range(len(nodes))}       # copies each rank sends: spread them
    came: dict[tuple[str, str], list[int]] = {}     # (rank's node, source node) -> ranks
    for rank, copies in sources.items():
        here = nodes[rank]
        if here in copies:
            routes[rank].local = copies[here].name
            routes[rank].source = (here, copies[here].name)
            came.setdefault((here, here), []).append(rank)
            continue
        node = sorted(copies)[0]       # (every node listed runs a rank of this step)
        sender = min(on[node], key=lambda r: (load[r], r))
        load[sender] += 1
        routes[sender].sends.append((rank, copies[node].name, copies[node].size))
        routes[rank].receive = (sender, copies[node].size)
        routes[rank].source = (node, copies[node].name)
        came.setdefault((here, node), []).append(rank)
    parts = [f"on {here} ranks {ranks_text(r)} from "
             + ("the node's own memory" if here == src else f"copies kept on {src}")
             for (here, src), r in sorted(came.items())]
    return Plan(routes, f"restoring step {step} from node memory "
                        f"(durable: {durable if durable is not None else 'none'}): "
                        + "; ".join(parts))


def _why_none(source: Sequence[int], where: Mapping[tuple[int, int], Mapping[str, Held]],
              steps: Sequence[int], durable: int | None) -> str:
    if not where:
        return "no copies in node memory"
    if durable is not None and steps[0] < durable:
        return f"the durable step {durable} is newer than every copy (newest: {steps[0]})"
    newest = steps[0]
    missing = [r for r in dict.fromkeys(source) if (r, newest) not in where]
    held_by = {r: sorted(s for (q, s) in where if q == r) for r in missing[:SHOWN]}
    shown = "; ".join(f"rank {r}: " + (", ".join(map(str, s[-3:])) if s else "none")
                      for r, s in held_by.items())
    more = f" and {len(missing) - SHOWN} more ranks" if len(missing) > SHOWN else ""
    return (f"no step of which every rank has a whole copy (the newest, {newest}, is missing "
            f"for ranks {ranks_text(missing)}: their steps held {shown}{more})")


def ranks_text(ranks: Sequence[int]) -> str:
    """Ranks as ranges: [0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    for r in sorted(ranks):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ",".join(out)
