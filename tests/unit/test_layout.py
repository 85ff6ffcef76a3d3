"""Layout math: Megatron rank order, its inverse, and the checks against a partition."""

from __future__ import annotations

from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctrain.errors import LayoutError
from hpctrain.spec.layout import Coords, Mesh, coords_to_rank, plan_layout, rank_to_coords
from hpctrain.spec.partitions import Partition
from helpers import specs

PART = Partition(name="gpu", gpus_per_node=4, cpus_per_node=32, mem_per_node_gb=256,
                 max_time="1-00:00:00", max_nodes=8)
degrees = st.integers(1, 6)
# specs.BASE on PART's partition (plan_layout reads nodes, GPUs, layout, time, launcher)
spec = partial(specs.spec, {**specs.BASE, "partition": "gpu"})


def layout_error(**changes) -> str:
    with pytest.raises(LayoutError) as exc:
        plan_layout(spec(**changes), PART)
    return str(exc.value)


def test_megatron_order_written_out() -> None:
    """tp=2, dp=2, pp=2: tp fastest, then dp, then pp (the table in docs/layouts.md)."""
    table = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
             (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert [tuple(rank_to_coords(r, tp=2, dp=2, pp=2)) for r in range(8)] == table
    assert rank_to_coords(5, tp=2, dp=2, pp=2) == Coords(pp=1, dp=0, tp=1)


@settings(max_examples=200, deadline=None)
@given(tp=degrees, dp=degrees, pp=degrees, data=st.data())
def test_rank_coords_bijection(tp: int, dp: int, pp: int, data) -> None:
    world = tp * dp * pp
    rank = data.draw(st.integers(0, world - 1))
    c = rank_to_coords(rank, tp, dp, pp)
    assert 0 <= c.pp < pp and 0 <= c.dp < dp and 0 <= c.tp < tp
    assert coords_to_rank(c.pp, c.dp, c.tp, tp, dp, pp) == rank


@settings(max_examples=100, deadline=None)
@given(tp=degrees, dp=degrees, pp=degrees)
def test_every_coordinate_is_hit_exactly_once(tp: int, dp: int, pp: int) -> None:
    world = tp * dp * pp
    seen = {rank_to_coords(r, tp, dp, pp) for r in range(world)}
    assert len(seen) == world


@settings(max_examples=100, deadline=None)
@given(tp=degrees, dp=degrees, pp=degrees, data=st.data())
def test_groups_partition_the_world(tp: int, dp: int, pp: int, data) -> None:
    lay = Mesh(tp=tp, dp=dp, pp=pp)
    rank = data.draw(st.integers(0, lay.world - 1))
    group = lay.tp_group(rank)
    assert rank in group and len(group) == tp
    assert group == list(range(group[0], group[0] + tp))  # tp ranks are consecutive
    assert len(lay.dp_group(rank)) == dp and len(lay.pp_group(rank)) == pp
    assert {lay.coords(r).tp for r in lay.pp_group(rank)} == {lay.coords(rank).tp}


@settings(max_examples=150, deadline=None)
@given(nodes=st.integers(1, 8), gpn=st.sampled_from([1, 2, 4, 8]), data=st.data())
def test_valid_plans_keep_tp_groups_inside_a_node(nodes: int, gpn: int, data) -> None:
    part = Partition(name="p", gpus_per_node=gpn, cpus_per_node=8, mem_per_node_gb=8)
    world = nodes * gpn
    tp = data.draw(st.sampled_from([d for d in range(1, gpn + 1) if gpn % d == 0]))
    pp = data.draw(st.sampled_from([d for d in range(1, world // tp + 1) if (world // tp) % d == 0]))
    plan = plan_layout(spec(partition="p", nodes=nodes, layout={"tp": tp, "pp": pp}), part)
    assert plan.tp * plan.dp * plan.pp == plan.world == world
    for rank in range(world):
        assert {plan.node_of(r) for r in plan.layout.tp_group(rank)} == {plan.node_of(rank)}


@pytest.mark.parametrize("bad", [
    dict(rank=8, tp=2, dp=2, pp=2), dict(rank=-1, tp=1, dp=1, pp=1), dict(rank=0, tp=0, dp=1, pp=1)])
def test_rank_out_of_range(bad) -> None:
    with pytest.raises(LayoutError):
        rank_to_coords(**bad)
    with pytest.raises(LayoutError, match="tp_rank=2 is outside 0..1"):
        coords_to_rank(0, 0, 2, tp=2, dp=1, pp=1)


def test_plan_for_each_launcher() -> None:
    p = plan_layout(spec(nodes=2, layout={"tp": 2}), PART)
    assert (p.world, p.tp, p.pp, p.dp, p.gpus_per_node) == (8, 2, 1, 4, 4)
    assert (p.tasks_per_node, p.procs_per_task, p.ntasks) == (1, 4, 2)
    for launcher in ("srun", "deepspeed"):
        q = plan_layout(spec(nodes=2, run={"command": ["x"], "launcher": launcher}), PART)
        assert (q.tasks_per_node, q.procs_per_task, q.ntasks) == (4, 1, 8)
    r = plan_layout(spec(nodes=3, gpus_per_node=2, layout={"pp": 3, "dp": 2}), PART)
    assert (r.world, r.dp, r.pp, r.time_s) == (6, 2, 3, 3600)


@pytest.mark.parametrize("changes, message", [
    (dict(layout={"tp": 3}), "tp=3 does not divide gpus_per_node=4: choose tp in 1, 2, 4 "
                             "(tensor parallelism stays inside a node)"),
    (dict(nodes=2, layout={"tp": 2, "pp": 3}), "tp=2 x pp=3 = 6 does not divide world=8 "
                                               "(nodes=2 x gpus_per_node=4): with tp=2 choose pp in 1, 2, 4"),
    (dict(nodes=2, layout={"tp": 2, "dp": 3}), "layout.dp=3 does not match world=8 / (tp=2 x pp=1) = 4: "
                                               "set dp=4 or leave it out"),
    (dict(nodes=2, layout={"dp": 4}), "layout.dp=4 does not match world=8 / (tp=1 x pp=1) = 8: "
                                      "set dp=8 or leave it out, or nodes=1 to get dp=4"),
    (dict(layout={"pp": 4, "num_layers": 6}), "num_layers=6 is not divisible by pp=4"),
    (dict(layout={"tp": 4, "num_heads": 6}), "num_heads=6 is not divisible by tp=4 (each tensor-"
                                             "parallel rank holds whole heads): choose tp in 1, 2"),
    (dict(gpus_per_node=8), "gpus_per_node=8 exceeds partition 'gpu''s 4 GPUs per node"),
    (dict(nodes=9), "nodes=9 exceeds partition 'gpu''s max_nodes=8: use nodes <= 8"),
    (dict(time="2-00:00:00"), "time=2-00:00:00 exceeds partition 'gpu''s max_time=1-00:00:00"),
    (dict(time="UNLIMITED"), "exceeds partition 'gpu''s max_time"),
    (dict(time="2", requeue={"signal_lead_s": 120}), "requeue.signal_lead_s=120 is not shorter "
                                                     "than time=2 (120 s)"),
])
def test_invalid_layouts_name_the_numbers_and_the_fix(changes, message) -> None:
    assert message in layout_error(**changes)


def test_partition_without_gpus_is_refused() -> None:
    cpu = Partition(name="cpu", gpus_per_node=0, cpus_per_node=8, mem_per_node_gb=8)
    with pytest.raises(LayoutError, match="has no GPUs"):
        plan_layout(spec(partition="cpu"), cpu)
