"""``hpctrain report``'s measured efficiency: the work a step did (rank 0's history, as the
script said it with ``ctx.set_work``), the model's FLOPs (the script's, else 6 x the
parameter count the script or the spec's ``[model]`` gave), the partition's facts (peak
TFLOPS, the price of a GPU-hour), and ``hpctrain plan``'s estimate for the same work;
:func:`hpctrain.report.efficiency.measure` (pure) does the arithmetic."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hpctrain.errors import HpctrainError
from hpctrain.planner.cost import DEFAULT_MFU, flops_per_token, for_flops
from hpctrain.protocol.progress import Work
from hpctrain.report.build import Report
from hpctrain.report.efficiency import Efficiency, Estimate, Facts, measure


def efficiency(result: Report, history: Sequence[Mapping[str, Any]],
               partition: str) -> Efficiency:
    """The measured figures of ``result``'s job, with plan's estimate beside them."""
    said = sorted((float(e["t"]), w) for e in history
                  if e.get("event") == "work" and (w := Work.parse(e)) is not None)
    last = said[-1][1] if said else None
    unit = last.unit if last is not None else ""
    flops = None
    if last is not None:
        flops = last.flops or (flops_per_token(last.mode, last.params)
                               if last.unit == "tokens" and last.params else None)
    facts = partition_facts(partition)
    found = measure(result, [(t, w.per_step) for t, w in said if w.unit == unit], unit,
                    flops, facts)
    if found.kept_flops and facts.peak_tflops > 0:
        gpus = max((run.gpus for run in result.runs), default=1)
        cost = for_flops(found.kept_flops, facts.peak_tflops, gpus, DEFAULT_MFU, facts.price)
        found.estimate = Estimate(cost.gpu_hours, cost.mfu, cost.cost)
    return found


def partition_facts(name: str) -> Facts:
    """The site's facts of partition ``name`` (none known: empty facts, and the report
    says what it could not measure)."""
    if not name:
        return Facts()
    from hpctrain.jobs.facts import site
    from hpctrain.spec.site import template_dirs

    try:
        part = site(template_dirs(())).partition(name)
    except HpctrainError:
        return Facts(name)
    return Facts(name, part.gpu_peak_tflops, part.gpu_hour_price, part.currency,
                 part.gpu_emulated)


def amount(value: float) -> str:
    """1234567 -> ``1.23M``: a count of tokens or samples, short."""
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def share(value: float) -> str:
    """A fraction as a percentage, legible however small (a CPU's MFU is ~1e-7)."""
    return f"{value:.1%}" if value >= 0.001 else f"{value * 100:.2g}%"


def money(value: float | None, facts: Facts) -> str:
    return "" if value is None else f"{value:.3g} {facts.currency}"


def caveat(facts: Facts) -> str:
    """What the figures are, where the GPUs are stand-ins."""
    if not facts.emulated:
        return ""
    return (f" (CPU figures: partition {facts.partition}'s GPUs are emulated; its peak "
            f"is that of the GPU it stands in for)")


def text_lines(eff: Efficiency) -> list[str]:
    """The report's lines on throughput, MFU, GPU-hours and cost."""
    facts = eff.facts
    lines = []
    if eff.throughput is None:
        lines.append("throughput: unknown (the script did not say a step's work: "
                     "ctx.set_work(tokens=...) or a callback's tokens_per_step=)")
    else:
        lines.append(f"throughput: {amount(eff.throughput)} {eff.unit}/s over "
                     f"{eff.step_s:.1f} s of steps ({amount(eff.work_done)} {eff.unit}, "
                     f"{amount(eff.work_kept)} kept){caveat(facts)}")
    if eff.mfu is not None:
        lines.append(f"MFU: {share(eff.mfu)} of {facts.peak_tflops:g} TFLOPS per GPU while "
                     f"stepping, {share(eff.allocation_mfu or 0)} of the whole allocation "
                     f"({amount(eff.flops_per_unit or 0)} model FLOPs per {eff.unit[:-1]})")
    elif eff.throughput is not None:
        lines.append("MFU: unknown (" + (f"no facts of partition {facts.partition or '?'}"
                                         if eff.flops_per_unit else
                                         "the model's FLOPs per unit are not known: "
                                         "set_work(flops_per_token=... or params=...), or "
                                         "[model] params in the spec") + ")")
    price = (f", {money(eff.cost, facts)} at {facts.price:g} {facts.currency} per GPU-hour"
             if eff.cost is not None else f" (no price: partition {facts.partition or '?'} has "
             "no gpu_hour_price)")
    lines.append(f"GPU-hours: {eff.gpu_hours:.3g} allocated{price}")
    if eff.estimate is not None:
        cost = f", {money(eff.estimate.cost, facts)}" if eff.estimate.cost is not None else ""
        ratio = f"; measured: {eff.gpu_hours / eff.estimate.gpu_hours:.3g}x that" \
            if eff.estimate.gpu_hours else ""
        lines.append(f"plan's estimate for the {amount(eff.work_kept)} {eff.unit} kept: "
                     f"{eff.estimate.gpu_hours:.3g} GPU-hours at {eff.estimate.mfu:.0%} MFU"
                     f"{cost}{ratio}")
    return lines
