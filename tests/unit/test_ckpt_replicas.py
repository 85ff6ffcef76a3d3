"""Who writes which value, planned once at the coordinator and checked at every save (pure:
hpctrain.checkpoint.replicas, .saveplan's cache and .coordinator; no torch, no files, no
process group: each simulated rank's side runs in turn, the collectives' contents handed
over as the real ones hand them).

The plan must never drop a value (someone writes each), never keep another rank's value as
shared, and never move a value its provisional owner has already written to another rank;
a later save reuses it only while no rank's structure changed, and still compares every
value.
"""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctrain.checkpoint import coordinator
from hpctrain.checkpoint.coordinator import Coordinator, cpus_per_rank
from hpctrain.checkpoint.replicas import plan_writes
from hpctrain.checkpoint.saveplan import PlanCache, PlanFailed, Structure, fingerprint_message

W, B, RNG, STAGE1 = (("w",), ()), (("b",), ()), (("rng",), ()), (("stage1",), ())


def _reference(held: list[list[tuple]]) -> tuple[dict, frozenset]:
    """The rule as 0.7 computed it on every rank, over every rank's (key, nbytes, sharded)
    list: a key held at two sizes or kinds is per rank; every other key goes, largest
    first, to the holder with the fewest bytes so far (ties: the lowest rank)."""
    holders: dict = {}
    kinds: dict = {}
    for rank, items in enumerate(held):
        for key, n, sharded in items:
            holders.setdefault(key, []).append(rank)
            kinds.setdefault(key, set()).add((n, sharded))
    per_rank = frozenset(k for k, v in kinds.items() if len(v) > 1)
    load = [sum(n for k, n, _ in items if k in per_rank) for items in held]
    owner = {}
    for key in sorted(set(holders) - per_rank,
                      key=lambda k: (-next(iter(kinds[k]))[0], repr(k))):
        rank = min(holders[key], key=lambda r: (load[r], r))
        owner[key] = rank
        load[rank] += next(iter(kinds[key]))[0]
    return owner, per_rank


def _groups(held: list[list[tuple]]) -> list[tuple[list, list[int]]]:
    by: dict = {}
    for rank, items in enumerate(held):
        by.setdefault(repr(items), (items, []))[1].append(rank)
    return list(by.values())


keys = st.sampled_from([((f"k{i}",), (0,)) for i in range(8)])
structures = st.lists(st.tuples(keys, st.sampled_from([4, 8, 64]), st.booleans()),
                      max_size=6, unique_by=lambda item: item[0])


@settings(max_examples=200, deadline=None)
@given(st.lists(structures, min_size=1, max_size=6), st.lists(st.integers(0, 5), max_size=12))
def test_the_plan_of_groups_is_the_plan_of_every_rank(distinct: list, picks: list) -> None:
    """Ranks with one structure are planned as one group: the same plan as ranks one by
    one (what every rank used to compute from every rank's list)."""
    held = [distinct[p % len(distinct)] for p in picks] or distinct
    plan = plan_writes(_groups(held))
    assert (plan.owner, plan.per_rank) == _reference(held)
    for key in {k for items in held for k, _, _ in items}:   # nothing dropped
        writers = [r for r, items in enumerate(held)
                   if any(k == key for k, _, _ in items) and plan.writes(r, key)]
        assert writers and (key in plan.per_rank or len(writers) == 1)


def test_replicas_are_written_once_and_spread_over_the_ranks() -> None:
    held = [[(W, 100, False), (B, 10, False)]] * 2
    plan = plan_writes(_groups(held))
    assert plan.per_rank == frozenset() and plan.owner == {W: 0, B: 1}


def test_a_value_held_at_two_sizes_or_kinds_is_per_rank_from_the_start() -> None:
    held = [[(RNG, 8, False), (W, 4, False)], [(RNG, 16, False), (W, 4, True)]]
    assert plan_writes(_groups(held)).per_rank == {RNG, W}


# -- the coordinator and each rank's cache, one save after another -----------------------
class Job:
    """``world`` simulated ranks and their caches; :meth:`save` runs the plan's exchanges
    as the collectives would (votes all-reduced by maximum, contributions gathered to rank
    0, its parts and answers scattered), and returns each rank's settled plan."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.caches = [PlanCache() for _ in range(world)]
        self.planned = 0

    def save(self, structures: list[Structure], prints: list[list[int] | None]) -> list:
        votes = [max(v) for v in zip(*(c.vote(s) for c, s in zip(self.caches, structures)))]
        plans = [c.reused(votes) for c in self.caches]
        if None in plans:
            parts, made = coordinator.plan([s.contribution() for s in structures])
            plans = [c.adopt(s, p, made if r == 0 else None)
                     for r, (c, s, p) in enumerate(zip(self.caches, structures, parts))]
            self.planned += 1
        messages = [fingerprint_message(p, plans[0].message) for p in prints]
        answers = coordinator.settle(self.caches[0].coordinator, messages)
        return [(plan, c.settled(plan, a, s))
                for plan, c, a, s in zip(plans, self.caches, answers, structures)]


def _structure(items: list, extras: list = (("lr",),), host: str = "n0") -> Structure:
    return Structure(list(items), list(extras), (host, (0, 1)))


PLAIN = [(W, 400, False), (B, 40, False), (RNG, 8, False)]


def test_a_later_save_of_the_same_structures_plans_nothing_and_still_compares_values() -> None:
    job = Job(3)
    first = job.save([_structure(PLAIN)] * 3, [[1, 2, 10 + r, 7] for r in range(3)])
    # every shared value written once, by the one who owns it; the RNG state per rank
    for key in (W, B):
        assert sum(plan.writes(key) for plan, _ in first) == 1
    for plan, (final, own_extras) in first:
        assert final.per_rank == {RNG} and own_extras == []
        assert final.first == plan.first      # nothing a rank wrote moves to another
    # same structures, new values: one all-reduce decides, no new plan; B now differs,
    # and so does the extra "lr"; the RNG states happen to agree this time
    later = job.save([_structure(PLAIN)] * 3, [[1, 20 + r, 5, 7 + r] for r in range(3)])
    assert job.planned == 1 and all(c.hits == 1 for c in job.caches)
    for (plan, (final, own_extras)), (before, _) in zip(later, first):
        assert plan == before and final.per_rank == {B} and own_extras == [("lr",)]
        assert final.writes(B) and (final.writes(W) == before.writes(W))


def test_a_structure_change_on_one_rank_plans_again_on_every_rank() -> None:
    job = Job(3)
    job.save([_structure(PLAIN)] * 3, [[1, 2, 3, 4]] * 3)
    token = job.caches[0].plan.token
    grown = [_structure(PLAIN), _structure(PLAIN + [(STAGE1, 4, False)]), _structure(PLAIN)]
    assert [c.vote(s)[0] for c, s in zip(job.caches, grown)] == [0, 1, 0]
    result = job.save(grown, [[1, 2, 3, 4], [1, 2, 3, 9, 4], [1, 2, 3, 4]])
    assert job.planned == 2 and len({c.plan.token for c in job.caches}) == 1
    assert job.caches[0].plan.token != token
    # the value only rank 1 holds is its to write, as shared (no other holder)
    assert result[1][1][0].writes(STAGE1) and STAGE1 not in result[1][1][0].per_rank
    # the node counts too: CPUs moved means another "alongside"
    moved = _structure(PLAIN, host="n1")
    assert job.caches[2].vote(moved)[0] == 1


def test_a_rank_whose_structure_differs_is_planned_in_its_own_group() -> None:
    """A pipeline's last stage holds other tensors than the first; one rank's RNG state
    is twice as long: per rank from the plan on, whatever the fingerprints say."""
    job = Job(4)
    stage0 = [(W, 400, False), (RNG, 8, False)]
    stage1 = [(STAGE1, 400, False), (RNG, 8, False)]
    odd = [(STAGE1, 400, False), (RNG, 16, False)]
    result = job.save([_structure(stage0)] * 2 + [_structure(stage1), _structure(odd)],
                      [[5, 1], [5, 1], [6, 1], [6, 1]])
    coord = job.caches[0].coordinator
    assert [len(r) for r in coord.ranks] == [2, 1, 1]
    for plan, (final, _) in result:
        assert final.per_rank == {RNG}               # by size, though the sums agree
        assert RNG in plan.first                     # so written first, by every holder
    for key in (W, STAGE1):   # shared within its stage, written once
        assert sum(p.writes(key) for p, _ in result) == 1


def test_a_rank_that_failed_before_its_fingerprints_leaves_the_plan_unsettled() -> None:
    job = Job(2)
    result = job.save([_structure(PLAIN)] * 2, [[1, 2, 3, 4], None])
    assert [settled for _, settled in result] == [None, None]
    # the plan itself stands: the next save of the same structures reuses it
    job.save([_structure(PLAIN)] * 2, [[1, 2, 3, 4]] * 2)
    assert job.planned == 1


def test_a_coordinator_that_fails_mid_plan_fails_the_plan_on_every_rank() -> None:
    caches = [PlanCache() for _ in range(3)]
    structures = [_structure(PLAIN)] * 3
    broken = [s.contribution() for s in structures]
    broken[2] = pickle.dumps(("digest", ("n0", ()), b"not zlib"))
    parts, made = coordinator.plan(broken)
    assert made is None and len(parts) == 3
    for cache, structure, part in zip(caches, structures, parts):
        with pytest.raises(PlanFailed, match="save plan failed on rank 0.*error"):
            cache.adopt(structure, part)
        assert cache.plan is None and cache.vote(structure)[0] == 1   # the next save plans
    # and comparing fingerprints without a plan answers every rank with the error
    answers = coordinator.settle(None, [fingerprint_message([1], 8)] * 3)
    with pytest.raises(PlanFailed, match="holds no plan"):
        caches[0].settled(None, answers[0], structures[0])


def test_the_answers_to_a_save_are_one_per_group_and_small() -> None:
    """What a rank receives does not grow with the world: 64 ranks of 2 structures."""
    structures = [_structure(PLAIN if r % 2 else PLAIN[:2] + [(STAGE1, 8, False)])
                  for r in range(64)]
    coord = Coordinator([s.contribution() for s in structures])
    parts = coord.parts()
    answers = coord.answers([fingerprint_message([1, 2, 3, 4], coord.width * 4)] * 64)
    assert max(map(len, parts)) < 200 and max(map(len, answers)) < 100
    assert len({id(a) for a in answers}) == 2


def test_cpus_per_rank_counts_the_cpus_the_ranks_of_a_node_share() -> None:
    every = range(8)
    # 4 unbound ranks on an 8-CPU node, 2 on another: 2 and 4 per rank
    assert cpus_per_rank([("a", every)] * 4 + [("b", every)] * 2) == [2.0] * 4 + [4.0] * 2
    # ranks bound to 2 CPUs each: their union over their number
    assert cpus_per_rank([("a", {2 * r, 2 * r + 1}) for r in range(4)]) == [2.0] * 4
    # 4 ranks on 2 cores (this machine kind): half a CPU each
    assert cpus_per_rank([("h", {0, 1})] * 4) == [0.5] * 4
