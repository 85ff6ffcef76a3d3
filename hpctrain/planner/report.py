"""A plan as one JSON-ready dict and as a readable table (pure: returns text)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hpctrain.planner.candidates import Candidate
from hpctrain.planner.core import Recommendation
from hpctrain.planner.memory import (FIXED_OVERHEAD, OVERHEAD_FRACTION, RECOMPUTE, Parallelism,
                                     activation_bytes, model_and_optimizer_bytes)
from hpctrain.planner.sizes import GB, gb, human_count

UNITS = "SI GB (1 GB = 1e9 bytes)"
STATE_LABEL = {"train": "model state (weights, gradients, optimizer)",
               "lora": "model state (frozen weights, adapter weights/gradients/optimizer)",
               "qlora": "model state (frozen weights, adapter weights/gradients/optimizer)",
               "inference": "weights"}


def assumptions(plan: Recommendation) -> list[str]:
    """Every assumption behind the numbers, in words."""
    w = plan.request.workload
    out = [f"memory in {UNITS}; a GPU sold as '80GB' has 80 GiB = 85.9 GB, pass "
           "--gpu-mem 80GiB to count it exactly",
           f"overhead = {FIXED_OVERHEAD / GB:g} GB (CUDA context, library workspaces) + "
           f"{OVERHEAD_FRACTION:.0%} of every term except the weights (allocator fragmentation)"]
    if w.arch.assumed:
        out.append(w.arch.assumed)
    if w.mode == "train":
        out.append("mixed-precision Adam: 16 bytes/param = 2 weights + 2 gradients + "
                   "12 optimizer (fp32 master, momentum, variance), sharded by ZeRO over dp")
    elif w.mode in ("lora", "qlora"):
        per = "2 (bf16)" if w.mode == "lora" else "0.5 (4-bit NF4)"
        out.append(f"frozen weights at {per} bytes/param; adapters = {w.adapter_fraction:.2%} "
                   "of the params (--adapter-fraction), trained with 16 bytes/param Adam")
    else:
        out.append("bf16 weights; KV cache = 2 x layers x seq x batch x hidden x 2 bytes "
                   "(full multi-head attention; grouped-query attention needs less)")
    if w.mode != "inference":
        out.append("activations per layer: Korthikanti et al. 2022 (bf16, sequence parallel "
                   "with tp); 1F1B pipelining holds all layers' worth on the first stage")
    return out


def candidate_dict(c: Candidate) -> dict[str, Any]:
    """One candidate as plain data (memory in GB)."""
    lay = c.layout
    memory = {k: gb(v) for k, v in c.memory.terms.items()}
    memory["total"] = gb(c.memory.total)
    return {"nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "gpus": c.gpus,
            "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "zero": lay.zero,
            "recompute": lay.recompute, "memory_gb": memory, "capacity_gb": gb(c.capacity),
            "fits": c.fits, "efficiency": {k: round(v, 4) for k, v in c.efficiency.items()}}


def activations_by_recompute(plan: Recommendation) -> dict[str, float] | None:
    """The recommended layout's activation memory with each recomputation choice."""
    w = plan.request.workload
    if w.mode == "inference":
        return None
    lay = plan.recommended.layout
    return {r: gb(activation_bytes(w, Parallelism(lay.tp, lay.pp, lay.dp, lay.zero, r)))
            for r in RECOMPUTE}


def shown_candidates(plan: Recommendation, show_all: bool = False) -> list[Candidate]:
    """The rows worth reading: a few smaller sizes, the recommended size, a few larger."""
    if show_all:
        return plan.candidates
    best = plan.recommended
    sizes = sorted({c.gpus for c in plan.candidates})
    top = {}
    for c in plan.candidates:  # ranked, so the first per size is that size's best
        top.setdefault(c.gpus, c)
    below = [top[g] for g in sizes if g < best.gpus][-3:]
    same = [c for c in plan.candidates if c.gpus == best.gpus][:6]
    above = [top[g] for g in sizes if g > best.gpus][:3]
    return below + same + above


def to_dict(plan: Recommendation, show_all: bool = False) -> dict[str, Any]:
    """The whole plan as one JSON-ready object."""
    req, hw, w = plan.request, plan.hardware, plan.request.workload
    return {
        "units": UNITS,
        "inputs": {"params": w.params, "mode": w.mode, "seq_len": w.seq_len,
                   "micro_batch": w.micro_batch, "layers": w.arch.layers,
                   "hidden": w.arch.hidden, "heads": w.arch.heads,
                   "adapter_fraction": w.adapter_fraction, "zero": req.zero,
                   "recompute": req.recompute or "auto", "nodes": req.nodes,
                   "max_nodes": req.max_nodes},
        "hardware": {"partition": hw.partition, "gpus_per_node": hw.gpus_per_node,
                     "gpu_mem_gb": hw.gpu_mem_gb, "gpu_peak_tflops": hw.gpu_peak_tflops,
                     "max_nodes": hw.max_nodes, "scaling": asdict(hw.curve)},
        "assumptions": assumptions(plan),
        "model_and_optimizer_gb": gb(model_and_optimizer_bytes(w)),
        "recommended": candidate_dict(plan.recommended),
        "reason": plan.reason,
        "activations_gb_by_recompute": activations_by_recompute(plan),
        "candidates": [candidate_dict(c) for c in shown_candidates(plan, show_all)],
        "candidates_total": len(plan.candidates),
        "cost": None if plan.cost is None else asdict(plan.cost),
    }


def _row(c: Candidate, mark: str, inference: bool) -> str:
    lay = c.layout
    zero, recompute = ("-", "-") if inference else (str(lay.zero), lay.recompute)
    return (f"  {mark}{c.nodes:>5} {c.gpus:>5} {lay.tp:>3} {lay.pp:>3} {lay.dp:>4} {zero:>4} "
            f"{recompute:>9} {gb(c.memory.total):>9.2f} {'yes' if c.fits else 'no':>4} "
            f"{c.efficiency['total']:>5.0%}")


def to_text(plan: Recommendation, show_all: bool = False) -> str:
    """The plan as a readable report."""
    d = to_dict(plan, show_all)
    req, hw, w, best = plan.request, plan.hardware, plan.request.workload, plan.recommended
    where = f"partition {hw.partition}" if hw.partition else "the given hardware"
    lines = [f"hpctrain plan: {human_count(w.params)} params, mode {w.mode}, seq {w.seq_len} x "
             f"micro-batch {w.micro_batch}, on {where} ({hw.gpus_per_node} x "
             f"{hw.gpu_mem_gb:g} GB GPUs per node)",
             f"model: {w.arch.layers} layers, hidden {w.arch.hidden}, {w.arch.heads} heads; "
             f"{STATE_LABEL[w.mode]} before sharding {d['model_and_optimizer_gb']:.2f} GB",
             "assumptions:"]
    lines += [f"  - {a}" for a in d["assumptions"]]
    lay = best.layout
    lines += ["", f"recommended: {best.nodes} node(s) x {best.gpus_per_node} GPU(s) = "
                  f"{best.gpus} GPU(s), tp={lay.tp} pp={lay.pp} dp={lay.dp}"
                  + ("" if w.mode == "inference" else f", ZeRO stage {lay.zero}, "
                     f"recompute={lay.recompute}"),
              f"  why: {plan.reason}", "  memory per GPU (GB):"]
    acts = d["activations_gb_by_recompute"]
    for term, value in d["recommended"]["memory_gb"].items():
        note = ""
        if term == "activations" and acts:
            note = "  (recompute none/selective/full: " + " / ".join(
                f"{acts[r]:.2f}" for r in RECOMPUTE) + ")"
        if term == "total":
            note = f"  of {gb(best.capacity):g} GB -> {'fits' if best.fits else 'does not fit'}"
        lines.append(f"    {term:<20} {value:>9.2f}{note}")
    eff = best.efficiency
    lines.append("  estimated efficiency {:.0%} (tensor {:.2f} x data {:.2f} x pipeline {:.2f}"
                 " x recompute {:.2f})".format(eff["total"], eff["tensor"], eff["data"],
                                               eff["pipeline"], eff["recompute"]))
    lines += ["", f"candidates ({len(d['candidates'])} of {len(plan.candidates)} shown; "
                  "--all for every one; * = recommended):",
              "    nodes  gpus  tp  pp   dp zero recompute    GB/GPU fits   eff"]
    lines += [_row(c, "*" if c is best else " ", w.mode == "inference")
              for c in shown_candidates(plan, show_all)]
    if plan.cost is not None:
        c = plan.cost
        lines += ["", f"cost: {c.flops_per_param_token:g} x {human_count(w.params)} params x "
                      f"{human_count(req.tokens or 0)} tokens = {c.flops:.3g} FLOPs at "
                      f"{c.mfu:.0%} MFU of {c.peak_tflops:g} TFLOPS per GPU",
                  f"  {c.gpu_hours:,.0f} GPU-hours; {c.wall_hours:,.1f} hours wall-clock on "
                  f"{c.gpus} GPU(s)"
                  + ("" if c.cost is None else f"; cost {c.cost:,.2f} at "
                     f"{req.price_per_gpu_hour:g} per GPU-hour")]
    return "\n".join(lines)
