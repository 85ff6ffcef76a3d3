"""Candidate layouts, the scaling-efficiency curve, ranking, cost and the no-fit advice."""

from __future__ import annotations

import math
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctrain.errors import PlanError
from hpctrain.planner import Hardware, Request, Workload, recommend, resolve_arch
from hpctrain.planner.advice import changes_that_fit
from hpctrain.planner.candidates import enumerate_candidates, node_counts
from hpctrain.planner.cost import estimate
from hpctrain.planner.memory import Parallelism
from hpctrain.planner.scaling import curve_for, efficiency
from hpctrain.planner.specfile import spec_dict, spec_toml
from hpctrain.spec.model import JobSpec


def hw(gpus: int = 8, mem: float = 80.0, max_nodes: int | None = 16, intra: str = "nvlink",
       inter: str = "infiniband", **scaling: float) -> Hardware:
    return Hardware(gpus, mem, 312.0, curve_for(intra, inter, scaling), max_nodes, "test")


def req(params: float, mode: str = "train", seq_len: int = 2048, **kw) -> Request:
    arch = resolve_arch(params, kw.pop("layers", None), None, kw.pop("heads", None))
    return Request(Workload(params, mode, seq_len, kw.pop("micro_batch", 1), arch), **kw)


# ---- enumeration ------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 4, 6, 8]), st.integers(1, 6), st.sampled_from([24, 30, 32, 40]),
       st.sampled_from([12, 16, 32, 40]))
def test_every_candidate_is_a_valid_layout(gpn: int, nodes: int, layers: int, heads: int) -> None:
    r = req(7e9, layers=layers, heads=heads)
    for c in enumerate_candidates(r.workload, hw(gpn), [nodes], None, None):
        lay = c.layout
        assert lay.tp * lay.pp * lay.dp == c.gpus == c.nodes * c.gpus_per_node
        assert gpn % lay.tp == 0 and heads % lay.tp == 0 and layers % lay.pp == 0
        assert c.gpus_per_node == gpn or nodes == 1  # only a single node may be partial
        assert not (lay.pp > 1 and lay.zero >= 2)    # DeepSpeed: no ZeRO-2/3 with pipelines


def test_node_counts_cover_small_counts_and_powers_of_two() -> None:
    assert node_counts(1, 5) == [1, 2, 3, 4, 5]
    big = node_counts(1, 200)
    assert big[:32] == list(range(1, 33)) and {64, 128, 200} <= set(big) and 100 not in big


def test_pinned_zero_and_recompute_are_respected() -> None:
    r = req(7e9, zero=1, recompute="selective")
    cands = enumerate_candidates(r.workload, hw(), [1, 2], 1, "selective")
    assert {(c.layout.zero, c.layout.recompute) for c in cands if c.layout.dp > 1} \
        == {(1, "selective")}


# ---- recommendation ----------------------------------------------------------------------
def test_70b_inference_recommends_two_gpus_with_tp2() -> None:
    plan = recommend(req(70e9, "inference"), hw())
    best = plan.recommended
    assert (best.gpus, best.layout.tp, best.layout.pp, best.fits) == (2, 2, 1, True)
    assert not any(c.fits for c in plan.candidates if c.gpus == 1)
    assert "fewest GPUs that fit (2)" in plan.reason


def test_7b_on_one_gpu_without_sharding_does_not_fit_with_advice() -> None:
    with pytest.raises(PlanError) as err:
        recommend(req(7e9, nodes=1, zero=0), hw(gpus=1))
    text = str(err.value)
    assert "no layout fits 80 GB GPUs" in text and "Smallest change that would fit:" in text


def test_7b_full_finetune_fits_8_gpus_with_zero3() -> None:
    plan = recommend(req(7e9, nodes=1, zero=3), hw(gpus=8))
    eight = [c for c in plan.candidates if c.gpus == 8 and c.layout.tp == 1 and c.layout.pp == 1]
    assert eight and eight[0].fits and eight[0].layout.zero == 3


def test_fixed_nodes_prefers_efficiency_over_fewest_gpus() -> None:
    plan = recommend(req(7e9, nodes=2), hw())
    fitting = [c for c in plan.candidates if c.fits]
    assert plan.recommended.efficiency["total"] == max(c.efficiency["total"] for c in fitting)
    assert all(c.nodes == 2 for c in plan.candidates)


def test_recommendation_is_fewest_gpus_then_highest_efficiency() -> None:
    plan = recommend(req(13e9), hw())
    best = plan.recommended
    fitting = [c for c in plan.candidates if c.fits]
    assert best.gpus == min(c.gpus for c in fitting)
    assert best.efficiency["total"] == max(c.efficiency["total"] for c in fitting
                                           if c.gpus == best.gpus)


# ---- scaling curve -----------------------------------------------------------------------
def test_default_curve_factors() -> None:
    curve = curve_for("nvlink", "infiniband", {})
    eff = efficiency(Parallelism(tp=8, pp=1, dp=4), 8, 4, curve)
    assert eff["tensor"] == pytest.approx(0.92**3)
    assert eff["data"] == pytest.approx(0.99**2)  # dp spans 4 nodes: two doublings
    assert eff["total"] == pytest.approx(math.prod(v for k, v in eff.items() if k != "total"))
    assert efficiency(Parallelism(pp=4), 8, 4, curve)["pipeline"] == pytest.approx(16 / 19)
    zero3 = efficiency(Parallelism(tp=8, dp=4, zero=3), 8, 4, curve)["data"]
    assert zero3 == pytest.approx(0.99**3)


def test_slower_links_lower_the_estimate() -> None:
    lay = Parallelism(tp=4, dp=8)
    fast = efficiency(lay, 4, 8, curve_for("nvlink", "infiniband", {}))["total"]
    slow = efficiency(lay, 4, 8, curve_for("pcie", "ethernet", {}))["total"]
    assert slow < fast


def test_partition_overrides_the_curve() -> None:
    curve = curve_for("nvlink", "infiniband", {"inter_node": 0.5, "intra_node": 1.0})
    eff = efficiency(Parallelism(tp=8, dp=2), 8, 2, curve)
    assert (eff["tensor"], eff["data"]) == pytest.approx((1.0, 0.5))


@pytest.mark.parametrize("overrides, match", [
    ({"inter_nodes": 0.9}, "unknown scaling key.*inter_nodes.*valid keys"),
    ({"inter_node": 1.5}, r"scaling.inter_node=1.5 must be a number in \(0, 1\]"),
    ({"intra_node": 0}, "scaling.intra_node=0"),
])
def test_bad_curve_overrides_are_refused(overrides: dict, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        curve_for("nvlink", "infiniband", overrides)


def test_unknown_link_without_override_is_refused() -> None:
    with pytest.raises(PlanError, match="unknown inter-node link 'omnipath'"):
        curve_for("nvlink", "omnipath", {})
    assert curve_for("nvlink", "omnipath", {"inter_node": 0.97}).inter_node == 0.97


# ---- cost ----------------------------------------------------------------------------------
def test_gpu_hours_is_6_n_t_over_mfu_peak() -> None:
    c = estimate("train", 7e9, 1e12, 312.0, gpus=8, mfu=0.4, price_per_gpu_hour=2.0)
    expected = 6 * 7e9 * 1e12 / (0.4 * 312e12) / 3600
    assert c.gpu_hours == pytest.approx(expected)
    assert c.cost == pytest.approx(2 * expected) and c.wall_hours == pytest.approx(expected / 8)
    assert estimate("qlora", 7e9, 1e12, 312.0, 1).gpu_hours == pytest.approx(expected * 4 / 6)


@pytest.mark.parametrize("params, published", [
    (7e9, 184_320), (13e9, 368_640), (70e9, 1_720_320),
])
def test_gpu_hours_match_llama2_published_figures(params: float, published: int) -> None:
    """Llama 2 (Touvron et al. 2023, Table 2): A100-80GB GPU-hours for 2T tokens."""
    ours = estimate("train", params, 2e12, 312.0, gpus=1).gpu_hours
    assert ours == pytest.approx(published, rel=0.10)


@pytest.mark.parametrize("kwargs, match", [
    ({"mfu": 0}, "--mfu=0"), ({"mfu": 1.5}, "--mfu=1.5"),
    ({"price_per_gpu_hour": -1}, "--price-per-gpu-hour=-1"),
])
def test_bad_cost_inputs_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        estimate("train", 7e9, 1e12, 312.0, 1, **kwargs)


def test_plan_carries_cost_for_the_recommended_gpus() -> None:
    plan = recommend(req(7e9, tokens=1e12, price_per_gpu_hour=2.5), hw())
    assert plan.cost is not None and plan.cost.gpus == plan.recommended.gpus
    assert plan.cost.cost == pytest.approx(plan.cost.gpu_hours * 2.5)


# ---- bad requests and advice ------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"nodes": 0}, "--nodes=0 must be >= 1"), ({"max_nodes": 99}, "exceeds partition"),
    ({"nodes": 2, "max_nodes": 2}, "not both"), ({"zero": 4}, "--zero=4"),
    ({"seq_len": 0}, "--seq-len=0"), ({"micro_batch": -1}, "--micro-batch=-1"),
    ({"price_per_gpu_hour": 2.0}, "needs --tokens"),
])
def test_nonsense_requests_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        recommend(req(7e9, **kwargs), hw())


def test_advice_lists_changes_that_really_fit_mildest_first() -> None:
    r = req(13e9, nodes=1, zero=1, recompute="none", micro_batch=2)
    changes = changes_that_fit(r, hw(gpus=8))
    flags = [c.flags.split()[0] for c in changes]
    assert all(c.candidate.fits for c in changes)
    order = ["--recompute", "--zero", "--micro-batch", "--nodes", "--mode", "--seq-len"]
    assert flags == sorted(flags, key=order.index)
    assert {"--recompute", "--zero", "--nodes", "--mode"} <= set(flags)


def test_advice_stacks_changes_when_no_single_one_fits() -> None:
    r = req(70e9, nodes=1, zero=0, recompute="none", micro_batch=4)
    (change,) = changes_that_fit(r, hw(gpus=8))
    flags = change.flags.split()
    assert flags[:2] == ["--recompute", "full"] and flags[2] == "--nodes", change.flags
    best = change.candidate
    assert best.fits and best.layout.recompute == "full" and best.nodes == int(flags[3]) > 1


def test_advice_puts_nodes_beyond_the_partition_last() -> None:
    with pytest.raises(PlanError) as err:
        recommend(req(70e9), hw(gpus=2, max_nodes=2))
    text = str(err.value)
    assert text.index("--mode lora") < text.index("--nodes")
    assert "more than partition 'test' allows (max_nodes=2)" in text


# ---- spec ----------------------------------------------------------------------------------
def test_spec_for_the_recommendation_is_a_valid_job_spec() -> None:
    plan = recommend(req(13e9), hw())
    spec = spec_dict(plan, partition="debug", time="01:00:00", checkpoint_dir="/ckpt/x")
    text = spec_toml(plan, spec)
    assert tomllib.loads(text) == spec
    job = JobSpec.from_dict(tomllib.loads(text))
    lay = plan.recommended.layout
    assert (job.layout.tp, job.layout.pp, job.layout.dp) == (lay.tp, lay.pp, lay.dp)
    assert job.nodes == plan.recommended.nodes and job.name == "train-13b"
    assert job.run.launcher == ("deepspeed" if lay.zero else "torchrun")


# ---- properties --------------------------------------------------------------------------
plan_inputs = st.tuples(st.floats(min_value=1e8, max_value=3e11),
                        st.sampled_from(["train", "lora", "qlora", "inference"]),
                        st.sampled_from([1, 2, 4, 8]), st.sampled_from([16.0, 24.0, 40.0, 80.0]),
                        st.sampled_from([512, 2048, 8192]))


@settings(max_examples=40, deadline=None)
@given(plan_inputs)
def test_the_recommendation_fits_and_nothing_smaller_does(inputs) -> None:
    params, mode, gpn, mem, seq = inputs
    try:
        plan = recommend(req(params, mode, seq, max_nodes=8), hw(gpn, mem, max_nodes=8))
    except PlanError as exc:
        assert "no layout fits" in str(exc) and "GB per GPU" in str(exc)
        return
    best = plan.recommended
    assert best.fits and best.memory.total <= mem * 1e9
    assert not any(c.fits for c in plan.candidates if c.gpus < best.gpus)


@settings(max_examples=30, deadline=None)
@given(plan_inputs)
def test_more_gpu_memory_never_needs_more_gpus(inputs) -> None:
    params, mode, gpn, mem, seq = inputs

    def gpus(capacity: float) -> float:
        try:
            return recommend(req(params, mode, seq, max_nodes=8),
                             hw(gpn, capacity, max_nodes=8)).recommended.gpus
        except PlanError:
            return math.inf
    assert gpus(mem * 2) <= gpus(mem)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1), min_size=1,
                max_size=5), st.text(st.characters(whitelist_categories=("L", "Nd")), min_size=1,
                                     max_size=20))
def test_spec_toml_round_trips_any_command_and_name(command: list[str], name: str) -> None:
    plan = recommend(req(1.3e9), hw())
    spec = spec_dict(plan, partition="debug", name=name, time="01:00:00", command=command)
    assert tomllib.loads(spec_toml(plan, spec)) == spec
