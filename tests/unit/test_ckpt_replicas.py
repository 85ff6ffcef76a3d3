"""Who writes which value (pure: hpctrain.checkpoint.replicas, no torch, no files).

A save starts writing on a provisional plan made from sizes alone and settles it once the
fingerprints are compared; the settled plan must never drop a value (someone writes each),
never keep another rank's value as shared, and never move a value its provisional owner
has already written to another rank.
"""

from __future__ import annotations

from hpctrain.checkpoint.replicas import WritePlan, plan_writes, settle

W, B, RNG, STAGE1 = (("w",), ()), (("b",), ()), (("rng",), ()), (("stage1",), ())


def _sizes(held: list[list[tuple]]) -> list[list[tuple]]:
    """What the ranks report before any checksum: every fingerprint None."""
    return [[(key, n, None) for key, n, _ in items] for items in held]


def _writers(plan: WritePlan, world: int, key: tuple) -> list[int]:
    return [r for r in range(world) if plan.writes(r, key)]


def test_replicas_are_written_once_and_spread_over_the_ranks() -> None:
    held = [[(W, 100, 1), (B, 10, 2)], [(W, 100, 1), (B, 10, 2)]]
    plan = plan_writes(held)
    assert plan.per_rank == frozenset()
    assert _writers(plan, 2, W) == [0] and _writers(plan, 2, B) == [1]


def test_a_value_that_differs_is_written_by_every_holder() -> None:
    held = [[(W, 100, 1), (RNG, 8, 10)], [(W, 100, 1), (RNG, 8, 11)], [(RNG, 8, 12)]]
    plan = plan_writes(held)
    assert plan.per_rank == {RNG}
    assert _writers(plan, 3, RNG) == [0, 1, 2] and len(_writers(plan, 3, W)) == 1


def test_settle_keeps_the_provisional_owners_and_adds_the_other_holders() -> None:
    held = [[(W, 100, 1), (B, 10, 2), (RNG, 8, 10), (STAGE1, 4, 5)],
            [(W, 100, 1), (B, 10, 2), (RNG, 8, 11)]]
    provisional = plan_writes(_sizes(held))
    assert provisional.per_rank == frozenset()  # sizes agree: all taken to be shared
    final = settle(provisional, held)
    assert final.per_rank == {RNG}
    for key in (W, B, STAGE1):  # shared values: the owner who has written them, alone
        assert _writers(final, 2, key) == _writers(provisional, 2, key)
    rng_owner = provisional.owner[RNG]
    assert rng_owner in _writers(final, 2, RNG) and _writers(final, 2, RNG) == [0, 1]
    # every value a rank wrote on the provisional plan stays in its final share
    for rank in range(2):
        for key in (W, B, RNG, STAGE1):
            assert not provisional.writes(rank, key) or final.writes(rank, key)


def test_settle_keeps_values_whose_sizes_already_differ_per_rank() -> None:
    held = [[(RNG, 8, 10)], [(RNG, 16, 10)]]
    provisional = plan_writes(_sizes(held))
    assert provisional.per_rank == {RNG}
    assert settle(provisional, held).per_rank == {RNG}


def test_dtensor_shards_have_no_fingerprint_and_stay_shared() -> None:
    held = [[(W, 100, None)], [(W, 100, None)]]
    final = settle(plan_writes(_sizes(held)), held)
    assert final.per_rank == frozenset() and len(_writers(final, 2, W)) == 1
