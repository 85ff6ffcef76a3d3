"""The slow-node detector (hpctrain.supervisor.slow), fed the ranks' heartbeats as the
supervisor sees them every LOOK_S: noise, one slow step, a save, a whole-job slowdown and
a node at half speed, two nodes of two ranks (the devcluster's shape) and eight of four."""

from __future__ import annotations

import random

import pytest

from hpctrain.protocol.dialog import Attempt
from hpctrain.protocol.progress import Progress
from hpctrain.supervisor.slow import LOOK_S, SlowRule, SlowWatch

ADDRESS = Attempt("run", 0, 0)


def records(own: dict[int, float], nodes: int, per_node: int, step: int,
            phase: dict[int, str] | None = None) -> dict[int, Progress]:
    return {r: Progress(r, ADDRESS, 0.0, 0.0, node=f"n{r // per_node + 1}", step=str(step),
                        boundaries=step, phase=(phase or {}).get(r, "training"), own=s)
            for r, s in own.items() if r < nodes * per_node}


def play(watch: SlowWatch, seconds: float, own_of, nodes: int = 2, per_node: int = 2,
         step_s: float = 0.3, phase_of=lambda t: {}) -> list[tuple[float, object]]:
    """Look every LOOK_S for ``seconds``; ``own_of(t, rank)``: each rank's figure."""
    found, t = [], 0.0
    while t < seconds:
        own = {r: own_of(t, r) for r in range(nodes * per_node)}
        step = int(t / step_s)
        found += [(t, f) for f in watch.look(records(own, nodes, per_node, step, phase_of(t)),
                                             t)]
        t += LOOK_S
    return found


def test_noise_alone_names_nobody() -> None:
    rng = random.Random(7)
    for shape in ((2, 2), (8, 4)):
        found = play(SlowWatch(), 600, lambda t, r: 0.1 * rng.uniform(0.8, 1.25), *shape)
        assert found == [], found


def test_one_slow_step_and_a_save_name_nobody() -> None:
    # a GC pause moves one rank's median for a few seconds (3x: longer than a step)
    spike = play(SlowWatch(), 120,
                 lambda t, r: 0.3 if (r == 2 and 40 <= t < 48) else 0.1)
    # a save: rank 0 in phase "saving" for 20 s (its figure is not a step's)
    save = play(SlowWatch(), 120, lambda t, r: 0.5 if (r == 0 and 40 <= t < 60) else 0.1,
                phase_of=lambda t: {0: "saving"} if 40 <= t < 60 else {})
    assert spike == [] and save == []


def test_a_node_at_half_speed_is_named_once_with_its_factor() -> None:
    found = play(SlowWatch(), 120, lambda t, r: 0.2 if (r in (2, 3) and t >= 30) else 0.1)
    assert len(found) == 1, found
    t, finding = found[0]
    assert finding.node == "n2" and abs(finding.factor - 2.0) < 0.01
    assert 30 + SlowRule().for_s <= t <= 30 + SlowRule().for_s + 2 * LOOK_S
    assert "every rank on node n2 took 0.2 s" in finding.evidence()


def test_one_look_below_is_forgiven_two_in_a_row_restart_the_clock() -> None:
    """Two nodes of two ranks: the others' median is two ranks'. One of them in a burst
    for a look (a neighbour's load, CI's machine) pulls it up: n2 at 0.2 s against 0.1 s
    reads 1.2x for that look."""
    def burst(every: int):
        return lambda t, r: 0.2 if r in (2, 3) and t >= 30 else \
            0.23 if r == 0 and t >= 30 and int(t / LOOK_S) % every == 0 else 0.1
    found = play(SlowWatch(), 120, burst(4))       # one look of four below: forgiven
    assert [f.node for _, f in found] == ["n2"], found
    t, finding = found[0]
    assert t <= 30 + SlowRule().for_s + 3 * LOOK_S, found
    assert finding.dips >= 2 and "never two in a row" in finding.evidence()

    def twice(t: float, r: int) -> float:      # two looks in a row below, every 12 s
        if r in (2, 3) and t >= 30:
            return 0.2
        return 0.23 if r == 0 and t >= 30 and int(t / LOOK_S) % 6 in (0, 1) else 0.1
    assert play(SlowWatch(), 120, twice) == []   # its clock never reaches for_s


def test_one_slow_rank_is_said_as_a_rank_never_as_its_node() -> None:
    """One GPU of four slow, or rank 0 given more work (its logging): the figures cannot
    tell which, so its node is not named; the rank is, once."""
    found = play(SlowWatch(), 60, lambda t, r: 0.25 if r == 13 else 0.1, nodes=8,
                 per_node=4)
    assert [(f.node, f.rank) for _, f in found] == [("n4", 13)], found
    assert "rank 13 on n4 took 0.25 s of its own per step against 0.1 s for the other " \
           "ranks" in found[0][1].evidence()
    logs = play(SlowWatch(), 60, lambda t, r: 0.18 if r == 0 else 0.1)
    assert [(f.node, f.rank) for _, f in logs] == [("n1", 0)], logs


def test_the_whole_job_slowing_is_said_once_and_blames_no_node() -> None:
    found = play(SlowWatch(), 120, lambda t, r: 0.2 if t >= 40 else 0.1)
    assert [(f.node, round(f.factor, 2)) for _, f in found] == [("", 2.0)], found


def test_a_tiny_step_needs_a_real_gap() -> None:
    """1 ms steps: 2 ms on one node is twice as slow but costs 1 ms a step (min_gap_s)."""
    assert play(SlowWatch(), 120, lambda t, r: 0.002 if r >= 2 else 0.001) == []
    assert play(SlowWatch(SlowRule(min_gap_s=0.0005)), 60,
                lambda t, r: 0.002 if r >= 2 else 0.001) != []


def test_one_busier_rank_does_not_hide_the_whole_job_slowing() -> None:
    """Rank 0 does 1.6x the others' work all along (said as an uneven rank); at 20 s the
    whole job slows 2x: said as well (an adversarial run found the rank's suspicion hid it)."""
    found = play(SlowWatch(), 80, lambda t, r: (0.16 if r == 0 else 0.1) *
                 (2.0 if t >= 20 else 1.0))
    assert ("", None) in [(f.node, f.rank) for _, f in found], found


def test_slow_warm_up_steps_do_not_set_the_jobs_pace() -> None:
    """The first figures come from slow warm-up steps (0.5 s), then 0.1 s; at 40 s every
    rank slows to 0.3 s: the job's best pace (0.1 s) is the one it is compared with."""
    found = play(SlowWatch(), 80, lambda t, r: 0.5 if t < 4 else 0.3 if t >= 40 else 0.1)
    assert [(f.node, round(f.factor, 1)) for _, f in found] == [("", 3.0)], found


def test_half_the_nodes_slow_is_the_job_slowing_not_a_node() -> None:
    """Two of three nodes slow (a bad switch) set the others' median themselves: no node is
    named (a known limit, said in docs/fault-recovery.md), the job's slowing is."""
    found = play(SlowWatch(), 80, lambda t, r: 0.2 if r >= 2 and t >= 20 else 0.1, nodes=3)
    assert [(f.node, f.rank) for _, f in found] == [("", None)], found


def test_the_other_ranks_median_is_the_median_of_what_is_left() -> None:
    """median_without: the median of a sorted list less some of its values, as
    statistics.median of what is left (duplicates included). A look over 8,192 ranks on
    1,024 nodes sorts them once instead of listing the others per node: 9 ms a look
    where it took seconds (measured 2026-11-29; the cost is quadratic no more)."""
    import statistics

    from hpctrain.supervisor.slow import median_without

    rng = random.Random(56)
    for _ in range(5000):
        values = [rng.choice([0.1, 0.2, 0.3, rng.random()]) for _ in range(rng.randint(3, 12))]
        removed = rng.sample(values, rng.randint(1, len(values) - 1))
        left = list(values)
        for value in removed:
            left.remove(value)
        assert median_without(sorted(values), removed) == \
            pytest.approx(statistics.median(left)), (values, removed)
