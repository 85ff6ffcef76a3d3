"""A slow node, found from the ranks' own time per step (pure; the supervisor looks every
LOOK_S and acts, :mod:`hpctrain.supervisor.slownodes`).

Each rank's heartbeat carries its own time per step (:mod:`hpctrain.runtime.pace`: the step
less its waits for the others, the median of its newest steps). A node's figure is its
*fastest* rank's: a node is slow when every rank on it is (a throttled node, its CPU, its
memory, its links), never because one rank does more work than the rest (rank 0's
logging, an evaluation on one rank: a common pattern, and no fault of the node). It is
compared with the median of the ranks on the other nodes, never with a median it is part
of (two nodes of two ranks: a median of four would hide half the gap). A node is slow when
its figure is ``factor`` times that and ``min_gap_s`` more per step, without a break for
``for_s`` and ``min_steps`` step boundaries (a break: two looks in a row below it; one is
forgiven, as the others' median of a few ranks jumps for a look when one of them saves or a
neighbour's load hits it): one slow step, a save (its ranks are not in training) or a GC
pause never lasts that long in the median. Each node is named once per
attempt.

One rank alone slower than the rest (by the same rule, against every other rank) is said
too, and nothing more: more work given to that rank, or one slow GPU among its node's, the
figures cannot tell which.

The job's own history too: once every rank has a figure, the job's best median so far is
its pace (slow warm-up steps do not set it); when the whole job (every node alike) runs
``factor`` times slower than that for ``for_s``, it is said once (a change that slowed
everyone: no node to blame). When half the nodes or more are slow they set the other
nodes' median themselves: no node is named, and this rule says the job slowed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from hpctrain.protocol import defaults
from hpctrain.protocol.progress import Progress

LOOK_S = 2.0        # how often the supervisor looks (a heartbeat's pace)


@dataclass(frozen=True)
class SlowRule:
    """The thresholds (``[health]`` in the spec; these defaults raise no alarm in any job
    of the test suite, and a node at half speed is named within about for_s + 5 s)."""

    factor: float = defaults.SLOW_FACTOR
    for_s: float = defaults.SLOW_FOR_S
    min_gap_s: float = 0.01
    min_steps: int = 3


@dataclass(frozen=True)
class Finding:
    """A node found slow (``node`` "": the whole job against its own best pace; ``rank``
    set: one rank alone, on ``node``)."""

    node: str
    factor: float          # its own time per step over the others' (or the job's pace)
    own_s: float           # its own time per step
    others_s: float        # the others' median (or the job's best pace)
    lasted_s: float        # how long it has been so
    steps: int             # step boundaries it passed meanwhile

    rank: int | None = None  # one rank alone, not its node
    dips: int = 0            # single looks below the threshold meanwhile (each forgiven)

    def evidence(self) -> str:
        """For the job log: what was seen."""
        who = f"rank {self.rank} on {self.node}" if self.rank is not None else \
            f"every rank on node {self.node}" if self.node else "the job's median node"
        than = "the other ranks" if self.rank is not None else \
            "the other nodes' ranks" if self.node else "its own best pace"
        return (f"{who} took {self.own_s:.3g} s of its own per step against {self.others_s:.3g} s "
                f"for {than} ({self.factor:.2f}x), for {self.lasted_s:.0f} s and "
                f"{self.steps} steps" + (f" (below {self.dips} look(s) of them, never two in a row)"
                                         if self.dips else ""))


@dataclass
class _Suspect:
    since: float
    boundaries: int
    below: bool = False    # the newest look found it below the threshold (one look's grace)
    dips: int = 0          # looks below the threshold since it became suspect


@dataclass
class SlowWatch:
    """One attempt's look at its nodes' pace (a new attempt: a new watch)."""

    rule: SlowRule = SlowRule()
    suspects: dict[str, _Suspect] = field(default_factory=dict)   # nodes, and "rank N"
    named: set[str] = field(default_factory=set)
    pace_s: float | None = None           # the job's best pace, once every rank has a figure
    slower_since: float | None = None
    worst: tuple[float, str] = (0.0, "")  # the highest node factor seen, and whose
    worst_job: float = 0.0                # ...and the job's, against its own pace

    def seen(self) -> str:
        """What this watch saw, for the job log at the step's end ("" when it had nothing
        to compare): the proof that no node was slow, or how close one came."""
        parts = []
        if self.worst[1]:
            parts.append(f"the slowest node's own time per step was at most "
                         f"{self.worst[0]:.2f}x the other nodes' ({self.worst[1]})")
        if self.worst_job:
            parts.append(f"the job's at most {self.worst_job:.2f}x its own best pace")
        if not parts:
            return ""
        nodes = sorted(n or "the whole job" for n in self.named if not n.startswith("rank "))
        ranks = sorted(n for n in self.named if n.startswith("rank "))
        return "; ".join(parts) + f" (slow at {self.rule.factor:g}x for {self.rule.for_s:g} s): " \
            + (f"found slow: {', '.join(nodes)}" if nodes else "no node slow") \
            + (f"; uneven: {', '.join(ranks)}" if ranks else "")

    def look(self, records: Mapping[int, Progress], now: float) -> list[Finding]:
        """The nodes found slow at this look (each once), and the whole job's slowdown."""
        training = [r for r in records.values() if r.own > 0 and r.phase == "training"]
        by_node: dict[str, list[Progress]] = {}
        for record in training:
            by_node.setdefault(record.node, []).append(record)
        ranked = sorted(r.own for r in training)     # once: every median below comes of it
        found = [f for node in by_node
                 if (f := self._judge(node, by_node, ranked, now)) is not None]
        ranks = [f for r in training if r.node not in self.suspects and r.node not in self.named
                 and (f := self._rank(r, ranked, now)) is not None]
        whole = None
        if any(not key.startswith("rank ") for key in self.suspects):
            self.slower_since = None        # a node is suspect: not the whole job's doing
        else:
            whole = self._whole(by_node, len(training) == len(records), now)
        return found + ranks + ([whole] if whole is not None else [])

    def _rank(self, record: Progress, ranked: list[float], now: float) -> Finding | None:
        """One rank alone slower than every other rank's median, long enough: said once."""
        key = f"rank {record.rank}"
        if len(ranked) < 3:
            return None
        ref = median_without(ranked, [record.own])
        if not self._slow_for(key, record.own, ref, record.boundaries, now):
            return None
        seen = self.suspects[key]
        self.named.add(key)
        return Finding(record.node, record.own / ref, record.own, ref, now - seen.since,
                       record.boundaries - seen.boundaries, rank=record.rank, dips=seen.dips)

    def _slow_for(self, key: str, own: float, ref: float, boundaries: int, now: float) -> bool:
        """Has ``key`` been ``factor`` times ``ref`` (and min_gap_s more) long enough, and
        not been named yet? Its suspicion starts, goes on or ends here."""
        rule = self.rule
        seen = self.suspects.get(key)
        if own < rule.factor * ref or own - ref < rule.min_gap_s:
            # one look below is a grace, two in a row end the suspicion: with few ranks to
            # compare with, one of them in a save or a burst of a neighbour's load pulls the
            # others' median up for a look (CI's loaded machine: a node at a third of the
            # speed named only after 57 s, its clock restarted by such looks)
            if seen is None or seen.below:
                self.suspects.pop(key, None)
            else:
                seen.below, seen.dips = True, seen.dips + 1
            return False
        if seen is None:
            seen = self.suspects[key] = _Suspect(now, boundaries)
        seen.below = False
        return key not in self.named and now - seen.since >= rule.for_s and \
            boundaries - seen.boundaries >= rule.min_steps

    def _judge(self, node: str, by_node: dict[str, list[Progress]], ranked: list[float],
               now: float) -> Finding | None:
        mine = by_node[node]
        own = min(r.own for r in mine)          # every rank on it: its fastest too
        boundaries = min(r.boundaries for r in mine)
        if len(mine) == len(ranked):            # no other node to compare with
            return None
        ref = median_without(ranked, [r.own for r in mine])
        if own / ref > self.worst[0]:
            self.worst = (own / ref, node)
        if not self._slow_for(node, own, ref, boundaries, now):
            return None
        seen = self.suspects[node]
        self.named.add(node)
        return Finding(node, own / ref, own, ref, now - seen.since, boundaries - seen.boundaries,
                       dips=seen.dips)

    def _whole(self, by_node: dict[str, list[Progress]], every_rank: bool,
               now: float) -> Finding | None:
        """The whole job against its own best pace: its figure is the median of the nodes'
        (each its fastest rank's, as a node is judged), once every rank has one."""
        if not by_node or not every_rank:
            return None
        median = statistics.median(min(r.own for r in rs) for rs in by_node.values())
        boundaries = min(r.boundaries for rs in by_node.values() for r in rs)
        if self.pace_s is None or median < self.pace_s:   # its best pace (after warm-up)
            self.pace_s = median
            self.slower_since = None
            return None
        self.worst_job = max(self.worst_job, median / self.pace_s)
        rule = self.rule
        if median < rule.factor * self.pace_s or median - self.pace_s < rule.min_gap_s:
            self.slower_since = None
            return None
        if self.slower_since is None:
            self.slower_since = now
        lasted = now - self.slower_since
        if "" in self.named or lasted < rule.for_s:
            return None
        self.named.add("")
        return Finding("", median / self.pace_s, median, self.pace_s, lasted, boundaries)


def median_without(ranked: list[float], removed: list[float]) -> float:
    """The median of ``ranked`` (sorted) without ``removed`` (some of its values): the
    other ranks' median, in the time of a node's ranks, not of all ranks (8,192 ranks on
    1,024 nodes: a look stays milliseconds, where a list per node made it seconds)."""
    gone = sorted(removed)
    n = len(ranked) - len(gone)

    def kth(k: int) -> float:      # the k-th smallest left: each removed value at or below
        i = k                      # the candidate pushes it one place on
        for value in gone:
            if value <= ranked[i]:
                i += 1
            else:
                break
        return ranked[i]

    return kth(n // 2) if n % 2 else (kth(n // 2 - 1) + kth(n // 2)) / 2


def slow_at_start(gflops: Mapping[str, float], factor: float) -> dict[str, float]:
    """The preflight check's verdict: the nodes whose rate is ``factor`` times below the
    median of the other nodes' ({node: how many times slower}, slowest first); nothing
    with fewer than two answers."""
    out = {}
    for node, rate in gflops.items():
        others = [v for n, v in gflops.items() if n != node]
        if others and rate > 0 and rate * factor <= statistics.median(others):
            out[node] = statistics.median(others) / rate
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
