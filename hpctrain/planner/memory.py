"""Per-GPU memory of one layout, term by term (SI bytes).

Sources (cited in docs/will-it-fit.md):

- Mixed-precision Adam keeps 16 bytes per trainable parameter: 2 (bf16/fp16 weights)
  + 2 (gradients) + 12 (fp32 master weights, momentum, variance); ZeRO stage 1 shards
  the 12 optimizer bytes over the data-parallel group, stage 2 also the gradients,
  stage 3 also the weights (Rajbhandari et al. 2020, "ZeRO", §3 and §5).
- Activations per transformer layer, 2-byte activations, sequence s, micro-batch b,
  hidden h, heads a (Korthikanti et al. 2022, "Reducing Activation Recomputation in
  Large Transformer Models", §4, Table 2): sbh(34 + 5as/h) without recomputation,
  34sbh with selective recomputation (attention core recomputed), 2sbh with full
  recomputation (only each layer's input kept), plus, for full recomputation, one
  layer's full set while it is recomputed. With tensor + sequence parallelism the first
  two are divided by tp (the paper's Table 2; full recomputation is not). Under 1F1B pipelining the first stage holds its L/pp layers
  for pp micro-batches in flight, i.e. L layers' worth whatever pp is (§4.2.3).
- LoRA keeps frozen weights in bf16 (2 bytes/param), QLoRA in 4-bit NF4 (0.5
  bytes/param, Dettmers et al. 2023); the adapters (a stated fraction of the
  parameters) are trained with mixed-precision Adam (16 bytes/param).
- Inference: bf16 weights plus the KV cache, 2 (K and V) x layers x seq x batch x
  hidden x 2 bytes, split by tp (heads) and pp (layers). Full multi-head attention is
  assumed; grouped-query attention needs less.
- Overhead: a fixed 1 GB (CUDA context, cuBLAS/NCCL workspaces) plus 10% of every
  term other than the weights: those are allocated and freed during each step, which
  fragments the caching allocator; weights are loaded once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpctrain.planner.model import Arch
from hpctrain.planner.sizes import GB
from hpctrain.spec.workload import MODES  # the modes a step's FLOPs know (one list)

RECOMPUTE = ("none", "selective", "full")
ADAM_BYTES = {"weights": 2.0, "gradients": 2.0, "optimizer": 12.0}  # ZeRO paper, mixed precision
FROZEN_BYTES = {"lora": 2.0, "qlora": 0.5}
ACT_BYTES = 2.0   # bf16 activations and KV cache
FIXED_OVERHEAD = 1.0 * GB
OVERHEAD_FRACTION = 0.10


@dataclass(frozen=True)
class Workload:
    """What is being run, independent of the layout."""

    params: float
    mode: str = "train"
    seq_len: int = 2048
    micro_batch: int = 1
    arch: Arch = field(default_factory=lambda: Arch(32, 4096, 32))
    adapter_fraction: float = 0.01  # LoRA/QLoRA trainable params / total params


@dataclass(frozen=True)
class Parallelism:
    """How the GPUs of a job are split; ``zero`` and ``recompute`` are training settings."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0
    recompute: str = "none"


@dataclass(frozen=True)
class Breakdown:
    """Bytes per GPU, one entry per term in display order; ``total`` includes overhead."""

    terms: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.terms.values())


def activation_bytes_per_layer(w: Workload, tp: int, recompute: str) -> float:
    """Stored activation bytes of one layer for one micro-batch (Korthikanti et al. 2022)."""
    s, b, h, a = w.seq_len, w.micro_batch, w.arch.hidden, w.arch.heads
    sbh = s * b * h
    if recompute == "none":
        return sbh * (34 + 5 * a * s / h) / tp
    if recompute == "selective":
        return 34 * sbh / tp
    if recompute == "full":
        return 2 * sbh  # Table 2 gives 2sbh per layer whatever tp is
    raise ValueError(f"recompute={recompute!r} not in {RECOMPUTE}")


def activation_bytes(w: Workload, lay: Parallelism) -> float:
    """Activations held by the busiest (first) pipeline stage."""
    layers_per_stage = w.arch.layers / lay.pp
    in_flight = lay.pp  # 1F1B: the first stage holds pp micro-batches (Korthikanti §4.2.3)
    held = activation_bytes_per_layer(w, lay.tp, lay.recompute) * layers_per_stage * in_flight
    if lay.recompute == "full":
        held += activation_bytes_per_layer(w, lay.tp, "none")  # the layer being recomputed
    return held


def kv_cache_bytes(w: Workload, lay: Parallelism) -> float:
    """K and V for every layer of this stage, heads split over tp."""
    return (2 * (w.arch.layers / lay.pp) * w.seq_len * w.micro_batch * w.arch.hidden
            * ACT_BYTES / lay.tp)


def _state_terms(trainable: float, lay: Parallelism) -> dict[str, float]:
    """Mixed-precision Adam state of ``trainable`` params per model shard, ZeRO-sharded."""
    shard = {"weights": lay.dp if lay.zero >= 3 else 1,
             "gradients": lay.dp if lay.zero >= 2 else 1,
             "optimizer": lay.dp if lay.zero >= 1 else 1}
    return {k: trainable * ADAM_BYTES[k] / shard[k] for k in ADAM_BYTES}


def breakdown(w: Workload, lay: Parallelism) -> Breakdown:
    """Every per-GPU memory term of ``w`` under ``lay``, overhead last."""
    per_shard = w.params / (lay.tp * lay.pp)  # tp and pp split the model
    layer_bf16 = w.arch.layer_params() * 2 / lay.tp
    terms: dict[str, float] = {}
    if w.mode == "inference":
        terms["weights"] = per_shard * 2
        terms["kv_cache"] = kv_cache_bytes(w, lay)
    elif w.mode == "train":
        terms.update(_state_terms(per_shard, lay))
        terms["activations"] = activation_bytes(w, lay)
    else:
        frozen_shard = lay.dp if lay.zero >= 3 else 1
        terms["frozen_weights"] = per_shard * FROZEN_BYTES[w.mode] / frozen_shard
        adapters = _state_terms(per_shard * w.adapter_fraction, lay)
        terms.update({f"adapter_{k}": v for k, v in adapters.items()})
        terms["activations"] = activation_bytes(w, lay)
    buffers = 0.0
    if w.mode != "inference" and lay.zero >= 3 and lay.dp > 1:
        buffers += 2 * layer_bf16  # ZeRO-3 gathers the current layer and prefetches the next
    if w.mode == "qlora":
        buffers += layer_bf16      # one layer dequantized to bf16 for its matmuls
    if buffers:
        terms["working_buffers"] = buffers
    transient = sum(v for k, v in terms.items() if k not in ("weights", "frozen_weights"))
    terms["overhead"] = FIXED_OVERHEAD + OVERHEAD_FRACTION * transient
    return Breakdown(terms)


def model_and_optimizer_bytes(w: Workload) -> float:
    """Weights + gradients + optimizer state of the whole model, before any sharding."""
    if w.mode == "train":
        return w.params * sum(ADAM_BYTES.values())
    if w.mode == "inference":
        return w.params * 2
    return w.params * (FROZEN_BYTES[w.mode] + w.adapter_fraction * sum(ADAM_BYTES.values()))
