"""When no layout fits: the smallest change that would, and the other changes that would.

Changes are tried from least to most invasive: the memory-saving settings that leave
the model and the maths unchanged (full recomputation, a higher ZeRO stage, a smaller
micro-batch with more gradient accumulation), then more nodes, then a cheaper method
(LoRA, QLoRA), then a shorter sequence. The first that fits is "the smallest change".
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.errors import PlanError
from hpctrain.planner.candidates import Candidate, Hardware, enumerate_candidates, node_counts
from hpctrain.planner.search import Request, node_range, search, with_changes
from hpctrain.planner.sizes import gb

ADVICE_MAX_NODES = 4096


@dataclass(frozen=True)
class Change:
    """One change to the request (as command-line flags) and the best layout it gives."""

    flags: str
    why: str
    candidate: Candidate
    beyond_limit: bool = False  # needs more nodes than the partition has: try it last


def _first_fit(req: Request, hw: Hardware) -> Candidate | None:
    fitting = [c for c in search(req, hw) if c.fits]
    return fitting[0] if fitting else None


def _more_nodes(req: Request, hw: Hardware) -> Change | None:
    _, high = node_range(req, hw)
    w = req.workload
    for n in node_counts(high + 1, ADVICE_MAX_NODES):
        fits = [c for c in enumerate_candidates(w, hw, [n], req.zero, req.recompute) if c.fits]
        if fits:
            over = (f", more than partition {hw.partition!r} allows (max_nodes="
                    f"{hw.max_nodes}): use a partition that has them"
                    if hw.max_nodes is not None and n > hw.max_nodes else "")
            return Change(f"--nodes {n}", f"{n} nodes, {n * hw.gpus_per_node} GPUs{over}",
                          fits[0], beyond_limit=bool(over))
    return None


Variant = tuple[str, str, dict]  # (flags, why, request changes)


def _kinds(req: Request) -> list[tuple[str, list[Variant]]]:
    """Each kind of change with its variants, mildest kind and variant first."""
    w = req.workload
    training = w.mode != "inference"
    kinds: list[tuple[str, list[Variant]]] = []
    if training and req.recompute not in (None, "full"):
        kinds.append(("recompute", [("--recompute full", "full activation recomputation",
                                     {"recompute": "full"})]))
    if training and req.zero is not None and req.zero < 3:
        kinds.append(("zero", [(f"--zero {z}", f"ZeRO stage {z}", {"zero": z})
                               for z in range(req.zero + 1, 4)]))
    sizes = [w.micro_batch // 2**k for k in range(1, 12) if w.micro_batch // 2**k >= 1]
    kinds.append(("micro_batch", [(f"--micro-batch {b}", f"micro-batch {b} (raise gradient "
                                   "accumulation to keep the global batch)", {"micro_batch": b})
                                  for b in sizes]))
    modes = {"train": ("lora", "qlora"), "lora": ("qlora",)}.get(w.mode, ())
    kinds.append(("mode", [(f"--mode {m}", f"{m.upper()} instead of {w.mode}", {"mode": m})
                           for m in modes]))
    seqs = [w.seq_len // 2**k for k in range(1, 12) if w.seq_len // 2**k >= 128]
    kinds.append(("seq_len", [(f"--seq-len {s}", f"sequence length {s}", {"seq_len": s})
                              for s in seqs]))
    return [(k, v) for k, v in kinds if v]


def _single(req: Request, hw: Hardware, variants: list[Variant]) -> Change | None:
    for flags, why, changes in variants:
        best = _first_fit(with_changes(req, **changes), hw)
        if best is not None:
            return Change(flags, why, best)
    return None


def _fit_at(req: Request, hw: Hardware, nodes: int | None) -> Candidate | None:
    """The best fitting layout of ``req``, in its own node range or on exactly ``nodes``."""
    if nodes is None:
        return _first_fit(req, hw)
    w = req.workload
    fits = [c for c in enumerate_candidates(w, hw, [nodes], req.zero, req.recompute) if c.fits]
    return fits[0] if fits else None


def _stacked(req: Request, hw: Hardware, stack: list[list[Variant]], more: Change | None) -> Change:
    """A fitting stack as one change: each kind's last variant (its strongest) is in force;
    kinds the fit does not need are dropped and the rest relaxed to their mildest variant
    that still fits. ``more`` adds nodes, found for the full stack."""
    nodes = more.candidate.nodes if more else None
    chosen: list[Variant | None] = [kind[-1] for kind in stack]

    def fit_with(variants: list[Variant | None]) -> Candidate | None:
        changed = with_changes(req, **{k: v for var in variants if var is not None
                                       for k, v in var[2].items()})
        return _fit_at(changed, hw, nodes)

    best = fit_with(chosen)
    for i, kind in enumerate(stack):
        for milder in [None, *kind[:-1]]:  # drop the kind, else its mildest variant that fits
            fit = fit_with(chosen[:i] + [milder] + chosen[i + 1:])
            if fit is not None:
                chosen[i], best = milder, fit
                break
    kept = [v for v in chosen if v is not None]
    flags = " ".join([*(f for f, _, _ in kept), *([more.flags] if more else [])])
    why = "; ".join([*(w for _, w, _ in kept), *([more.why] if more else [])])
    if best is None:  # cannot happen: the full stack fitted (with ``more``'s nodes)
        raise PlanError(f"internal error: the stack {flags!r} stopped fitting")
    return Change(flags, why, best, more.beyond_limit if more else False)


def _combined(req: Request, hw: Hardware) -> Change | None:
    """No single change fits: stack the strongest variant of each kind, mildest kind first,
    adding more nodes when that completes a fit; then drop or relax what is not needed."""
    stack: list[list[Variant]] = []
    acc = req
    for _, variants in _kinds(req):
        for i, variant in enumerate(variants):
            if _first_fit(with_changes(acc, **variant[2]), hw) is not None:
                return _stacked(req, hw, [*stack, variants[:i + 1]], None)
        stack.append(variants)
        acc = with_changes(acc, **variants[-1][2])
        more = _more_nodes(acc, hw)
        if more is not None:
            return _stacked(req, hw, stack, more)
    return None


def changes_that_fit(req: Request, hw: Hardware) -> list[Change]:
    """One change per kind (the mildest of each kind that fits), smallest first; when no
    single change fits, the smallest stack of changes that does."""
    found: list[Change] = []
    for kind, variants in _kinds(req):
        if kind == "mode":  # more nodes rank between the settings and a change of method
            more = _more_nodes(req, hw)
            if more is not None:
                found.append(more)
        change = _single(req, hw, variants)
        if change is not None:
            found.append(change)
    if not found:
        combined = _combined(req, hw)
        return [combined] if combined is not None else []
    return sorted(found, key=lambda c: c.beyond_limit)  # stable: keeps the order otherwise


def no_fit_message(req: Request, hw: Hardware, candidates: list[Candidate]) -> str:
    """The error text: what was tried, the leanest layout's need, and what would fit."""
    leanest = min(candidates, key=lambda c: c.memory.total) if candidates else None
    low, high = node_range(req, hw)
    nodes = f"{low}" if low == high else f"1..{high}"
    text = (f"no layout fits {gb(hw.gpu_mem_gb * 1e9):g} GB GPUs ({req.workload.mode}, "
            f"{nodes} node(s) of {hw.gpus_per_node} GPUs)")
    if leanest is not None:
        lay = leanest.layout
        text += (f": the leanest, tp={lay.tp} pp={lay.pp} dp={lay.dp} ZeRO-{lay.zero} "
                 f"recompute={lay.recompute} on {leanest.gpus} GPU(s), needs "
                 f"{gb(leanest.memory.total):g} GB per GPU")
    changes = changes_that_fit(req, hw)
    if not changes:
        return text + (". No change tried, alone or together, fits (more nodes, ZeRO-3, full "
                       "recomputation, micro-batch 1, QLoRA, shorter sequences): use GPUs with "
                       "more memory or a smaller model")
    first, *others = changes
    text += f". Smallest change that would fit: {first.flags} ({first.why}; {_brief(first)})"
    if others:
        text += ". Other changes that fit: " + "; ".join(f"{c.flags} ({c.why}; {_brief(c)})"
                                                          for c in others)
    return text


def _brief(change: Change) -> str:
    c = change.candidate
    lay = c.layout
    return (f"tp={lay.tp} pp={lay.pp} dp={lay.dp} on {c.gpus} GPU(s), "
            f"{gb(c.memory.total):g} GB per GPU")
