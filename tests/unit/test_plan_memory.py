"""The per-GPU memory model, term by term, and the known figures from issue 7."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from hpctrain.planner.memory import (FIXED_OVERHEAD, OVERHEAD_FRACTION, Parallelism, Workload,
                                     activation_bytes, activation_bytes_per_layer, breakdown,
                                     kv_cache_bytes, model_and_optimizer_bytes)
from hpctrain.planner.model import resolve_arch

GB = 1e9
CAPACITY_80GB = 80 * GB


def work(params: float, mode: str = "train", **kw) -> Workload:
    return Workload(params, mode, arch=resolve_arch(params, None, None, None), **kw)


# ---- known figures (issue 7) ------------------------------------------------------------
def test_70b_weights_in_bf16_are_140_gb() -> None:
    mem = breakdown(work(70e9, "inference"), Parallelism())
    assert mem.terms["weights"] == pytest.approx(140 * GB)


def test_70b_inference_does_not_fit_one_80gb_gpu_and_fits_two_with_tp2() -> None:
    w = work(70e9, "inference")
    assert breakdown(w, Parallelism(tp=1)).total > CAPACITY_80GB
    two = breakdown(w, Parallelism(tp=2))
    assert two.terms["weights"] == pytest.approx(70 * GB)
    assert two.total <= CAPACITY_80GB


def test_7b_full_finetune_needs_112_gb_of_model_and_optimizer_state() -> None:
    w = work(7e9)
    assert model_and_optimizer_bytes(w) == pytest.approx(112 * GB)
    one = breakdown(w, Parallelism(zero=0, recompute="full"))
    state = one.terms["weights"] + one.terms["gradients"] + one.terms["optimizer"]
    assert state == pytest.approx(112 * GB)
    assert one.total > CAPACITY_80GB  # not one 80 GB GPU without sharding


def test_7b_full_finetune_fits_8_gpus_with_zero3() -> None:
    mem = breakdown(work(7e9), Parallelism(dp=8, zero=3, recompute="none"))
    assert mem.terms["weights"] + mem.terms["gradients"] + mem.terms["optimizer"] \
        == pytest.approx(112 * GB / 8)
    assert mem.total <= CAPACITY_80GB


@pytest.mark.parametrize("seq_len", [512, 1024, 2048, 4096])
def test_qlora_70b_fits_one_80gb_gpu_for_modest_sequence_lengths(seq_len: int) -> None:
    mem = breakdown(work(70e9, "qlora", seq_len=seq_len), Parallelism(recompute="full"))
    assert mem.terms["frozen_weights"] == pytest.approx(35 * GB)
    assert mem.total <= CAPACITY_80GB


def test_qlora_70b_stops_fitting_one_gpu_for_long_sequences() -> None:
    mem = breakdown(work(70e9, "qlora", seq_len=16384), Parallelism(recompute="full"))
    assert mem.total > CAPACITY_80GB


# ---- each term ---------------------------------------------------------------------------
def test_adam_is_16_bytes_per_param_split_2_2_12() -> None:
    mem = breakdown(work(1e9), Parallelism())
    assert [mem.terms[k] / 1e9 for k in ("weights", "gradients", "optimizer")] \
        == pytest.approx([2, 2, 12])


@pytest.mark.parametrize("zero, shards", [
    (0, (1, 1, 1)), (1, (1, 1, 8)), (2, (1, 8, 8)), (3, (8, 8, 8)),
])
def test_zero_stages_shard_optimizer_then_gradients_then_weights(zero: int, shards) -> None:
    mem = breakdown(work(1e9), Parallelism(dp=8, zero=zero))
    got = [mem.terms[k] for k in ("weights", "gradients", "optimizer")]
    assert got == pytest.approx([2 * GB / shards[0], 2 * GB / shards[1], 12 * GB / shards[2]])


def test_tp_and_pp_shard_the_model() -> None:
    w = work(8e9)
    assert breakdown(w, Parallelism(tp=2, pp=4)).terms["optimizer"] == pytest.approx(12 * GB)


def test_activation_formula_matches_korthikanti() -> None:
    w = Workload(7e9, seq_len=2048, micro_batch=2, arch=resolve_arch(7e9, 32, 4096, 32))
    s, b, h, a = 2048, 2, 4096, 32
    assert activation_bytes_per_layer(w, 1, "none") == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(w, 4, "none") == pytest.approx(s * b * h * (34 + 5 * a * s / h) / 4)
    assert activation_bytes_per_layer(w, 1, "selective") == pytest.approx(34 * s * b * h)
    assert activation_bytes_per_layer(w, 1, "full") == pytest.approx(2 * s * b * h)
    assert activation_bytes_per_layer(w, 8, "full") == pytest.approx(2 * s * b * h)  # Table 2


def test_activations_cover_all_layers_whatever_pp_under_1f1b() -> None:
    w = work(7e9)
    per_layer = activation_bytes_per_layer(w, 1, "selective")
    for pp in (1, 2, 4, 8):
        assert activation_bytes(w, Parallelism(pp=pp, recompute="selective")) \
            == pytest.approx(per_layer * 32)


def test_full_recompute_adds_one_layer_being_recomputed() -> None:
    w = work(7e9)
    full = activation_bytes(w, Parallelism(recompute="full"))
    assert full == pytest.approx(32 * activation_bytes_per_layer(w, 1, "full")
                                 + activation_bytes_per_layer(w, 1, "none"))


def test_kv_cache_is_2_layers_seq_batch_hidden_bytes() -> None:
    w = Workload(7e9, "inference", seq_len=4096, micro_batch=3,
                 arch=resolve_arch(7e9, 32, 4096, 32))
    assert kv_cache_bytes(w, Parallelism()) == pytest.approx(2 * 32 * 4096 * 3 * 4096 * 2)
    assert kv_cache_bytes(w, Parallelism(tp=2, pp=4)) == pytest.approx(2 * 32 * 4096 * 3 * 4096 * 2 / 8)


@pytest.mark.parametrize("mode, frozen", [("lora", 2.0), ("qlora", 0.5)])
def test_lora_frozen_weights_and_adapter_state(mode: str, frozen: float) -> None:
    w = work(10e9, mode, adapter_fraction=0.01)
    mem = breakdown(w, Parallelism())
    assert mem.terms["frozen_weights"] == pytest.approx(10e9 * frozen)
    adapters = [mem.terms[f"adapter_{k}"] for k in ("weights", "gradients", "optimizer")]
    assert adapters == pytest.approx([0.1e9 * 2, 0.1e9 * 2, 0.1e9 * 12])


def test_overhead_is_fixed_plus_fraction_of_non_weight_terms() -> None:
    mem = breakdown(work(7e9), Parallelism(recompute="full"))
    rest = sum(v for k, v in mem.terms.items() if k not in ("weights", "overhead"))
    assert mem.terms["overhead"] == pytest.approx(FIXED_OVERHEAD + OVERHEAD_FRACTION * rest)


def test_total_is_the_sum_of_the_terms() -> None:
    mem = breakdown(work(13e9, "qlora"), Parallelism(tp=2, dp=4, zero=3, recompute="selective"))
    assert mem.total == pytest.approx(sum(mem.terms.values()))
    assert "working_buffers" in mem.terms  # ZeRO-3 gather + QLoRA dequantisation


layouts = st.builds(Parallelism, tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
                    dp=st.sampled_from([1, 2, 8, 64]), zero=st.integers(0, 3),
                    recompute=st.sampled_from(["none", "selective", "full"]))


@given(layouts, st.sampled_from(["train", "lora", "qlora", "inference"]))
def test_every_term_is_positive(lay: Parallelism, mode: str) -> None:
    assert all(v > 0 for v in breakdown(work(13e9, mode), lay).terms.values())


@given(layouts.filter(lambda lay: lay.dp > 1 and lay.zero < 3),
       st.sampled_from(["train", "lora", "qlora"]))
def test_a_higher_zero_stage_never_needs_more_memory(lay: Parallelism, mode: str) -> None:
    # except ZeRO-3 for (Q)LoRA: the frozen weights are small, the gather buffers are not
    assume(mode == "train" or lay.zero < 2)
    w = work(13e9, mode)
    assert breakdown(w, replace(lay, zero=lay.zero + 1)).total <= breakdown(w, lay).total


@given(st.integers(1, 8), st.sampled_from(["none", "selective", "full"]))
def test_less_recomputation_never_needs_less_memory(b: int, recompute: str) -> None:
    w = work(7e9, micro_batch=b)
    order = ["full", "selective", "none"]
    values = [activation_bytes(w, Parallelism(recompute=r)) for r in order]
    assert values == sorted(values)
