"""Estimated scaling efficiency of a layout: a default curve, overridable per partition.

The estimate multiplies independent factors, each from a published figure (sources
and derivations in docs/will-it-fit.md):

- tensor parallelism, per doubling of tp inside a node: NVLink 0.92 (Megatron-LM,
  Shoeybi et al. 2019: 77% weak-scaling efficiency at 8-way model parallelism on
  NVSwitch nodes, 0.77 ** (1/3)); PCIe 0.80 (a conservative estimate: PCIe has
  about a tenth of NVLink's bandwidth; measure and override).
- data parallelism, per doubling of the nodes a data-parallel group spans:
  InfiniBand 0.99 (Megatron-LM 2019: 74% at 512 GPUs vs 77% at 8, i.e. 96% across
  32 DGX-2H nodes, 0.96 ** (1/5)); Ethernet 0.95 (Horovod, Sergeev & Del Balso 2018: 68% for VGG-16 on
  128 servers over 25 Gbit/s RoCE, 0.68 ** (1/7)). ZeRO-3 moves 1.5x the data of
  plain data parallelism (Rajbhandari et al. 2020), so its exponent is 1.5x.
  Data parallelism inside a node is taken as free (overlapped with the backward pass).
- pipeline bubble: m / (m + pp - 1) with m = 4 x pp micro-batches per step (GPipe,
  Huang et al. 2019: the bubble is small once m >= 4 x stages; Narayanan et al. 2021).
- recomputation: full recomputation re-runs the forward pass, 4 passes of work
  instead of 3 (0.75); selective recomputation costs 2.7% more FLOPs for GPT-3 175B
  (Korthikanti et al. 2022), 1 / 1.027 = 0.97.

A partition overrides any factor in its ``[scaling]`` table: ``intra_node``,
``inter_node``, ``microbatches_per_stage``, ``recompute_full``, ``recompute_selective``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from hpctrain.errors import PlanError
from hpctrain.planner.memory import Parallelism

INTRA_NODE = {"nvlink": 0.92, "pcie": 0.80}
INTER_NODE = {"infiniband": 0.99, "ethernet": 0.95}
DEFAULTS = {"microbatches_per_stage": 4.0, "recompute_full": 0.75, "recompute_selective": 0.97}
KEYS = ("intra_node", "inter_node", *DEFAULTS)


@dataclass(frozen=True)
class Curve:
    """The factors in use for one partition."""

    intra_node: float
    inter_node: float
    microbatches_per_stage: float = 4.0
    recompute_full: float = 0.75
    recompute_selective: float = 0.97


def curve_for(intra_link: str, inter_link: str, overrides: Mapping[str, float]) -> Curve:
    """The default curve for these links, with a partition's overrides applied."""
    unknown = sorted(set(overrides) - set(KEYS))
    if unknown:
        raise PlanError(f"unknown scaling key(s) {', '.join(unknown)} in the partition's "
                        f"[scaling] table: valid keys are {', '.join(KEYS)}")
    for link, table, key in ((intra_link, INTRA_NODE, "intra_node"),
                             (inter_link, INTER_NODE, "inter_node")):
        if link not in table and key not in overrides:
            raise PlanError(f"unknown {key.replace('_', '-')} link {link!r}: use one of "
                            f"{', '.join(table)} or set scaling.{key} in the partition")
    values = {"intra_node": INTRA_NODE.get(intra_link, 0.0),
              "inter_node": INTER_NODE.get(inter_link, 0.0), **DEFAULTS}
    for key, value in overrides.items():
        bad = not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0
        if bad or (key != "microbatches_per_stage" and value > 1):
            raise PlanError(f"scaling.{key}={value!r} must be a number in (0, 1]"
                            + (" (or >= 1 micro-batches)" if key == "microbatches_per_stage" else ""))
        values[key] = float(value)
    return Curve(**values)


def efficiency(lay: Parallelism, gpus_per_node: int, nodes: int, curve: Curve) -> dict[str, float]:
    """Factors and their product (``total``) for ``lay`` on ``nodes`` nodes."""
    dp_nodes = max(1.0, lay.tp * lay.dp / gpus_per_node) if nodes > 1 else 1.0
    dp_exp = math.log2(dp_nodes) * (1.5 if lay.zero >= 3 else 1.0)
    m = curve.microbatches_per_stage * lay.pp
    parts = {
        "tensor": curve.intra_node ** math.log2(lay.tp),
        "data": curve.inter_node ** dp_exp,
        "pipeline": m / (m + lay.pp - 1),
        "recompute": {"none": 1.0, "full": curve.recompute_full,
                      "selective": curve.recompute_selective}[lay.recompute],
    }
    parts["total"] = math.prod(parts.values())
    return parts
