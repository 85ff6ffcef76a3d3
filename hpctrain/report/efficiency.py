"""What the job's steps did, measured: throughput, MFU, GPU-hours and cost, and over time.

Pure: :func:`measure` takes a :class:`~hpctrain.report.build.Report` (its step completions
and where the GPU-time went), the work of a step as the script said it (``ctx.set_work``,
read from rank 0's history by ``hpctrain report``), the model's FLOPs per unit of work and
the partition's facts (its peak TFLOPS per GPU, the price of a GPU-hour).

- **throughput**: units (tokens or samples) of every completed step, redone ones too,
  per second of step time (the report's kept + slow + redone seconds);
- **MFU**: the model FLOPs those steps did per second per GPU, over the partition's peak;
- **MFU of the allocation**: the kept steps' FLOPs over every allocated GPU-second at peak
  (start-ups, saves, lost work and stops included): what ``hpctrain plan``'s assumed MFU
  stands for, so its estimate for the same work sits beside the measured GPU-hours;
- **GPU-hours** allocated, and their **cost** at the partition's price.

A step completed before the script said its work counts no units.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Sequence

from hpctrain.report.build import Report

STEP_CATEGORIES = ("kept", "slow", "redone")    # the report's categories that are step time

POINTS = 60      # throughput-over-time points at most (a window of steps each)


@dataclass(frozen=True)
class Facts:
    """What the site says of the partition the job ran on."""

    partition: str = ""
    peak_tflops: float = 0.0            # dense bf16 per GPU
    price: float | None = None          # one GPU-hour
    currency: str = ""
    emulated: bool = False              # stand-in GPUs (the devcluster): the CPUs' figures


@dataclass
class Estimate:
    """``hpctrain plan``'s estimate for the work the job kept (planner.cost)."""

    gpu_hours: float
    mfu: float                          # the MFU it assumes
    cost: float | None


@dataclass
class Efficiency:
    """The job's measured figures (see the module docstring); None where not known."""

    unit: str                           # "tokens" | "samples" | "" (the script said none)
    work_done: float                    # units of every completed step
    work_kept: float                    # units of the kept steps
    step_s: float                       # seconds of step time (kept + slow + redone)
    throughput: float | None            # units per second of step time
    flops_per_unit: float | None        # model FLOPs per token (or sample)
    mfu: float | None
    allocation_mfu: float | None
    gpu_hours: float
    cost: float | None
    facts: Facts
    estimate: Estimate | None = None
    series: list[tuple[float, float]] = field(default_factory=list)  # (t, units/s)

    @property
    def kept_flops(self) -> float | None:
        """The model FLOPs of the kept steps: what ``plan``'s estimate is for."""
        return self.work_kept * self.flops_per_unit if self.flops_per_unit else None


def measure(report: Report, work: Sequence[tuple[float, float]], unit: str,
            flops_per_unit: float | None, facts: Facts) -> Efficiency:
    """The figures of ``report``'s job; ``work``: (time said, units per step) in time order
    (the step completions after each count its units), ``unit`` what they are."""
    units = [_units_at(t, work) for t, _, _ in report.points]
    done = sum(units)
    kept = sum(u for u, (_, _, was_kept) in zip(units, report.points) if was_kept)
    # the steps' whole time: a slow node's extra ("slow") is step time too
    step_s = sum(sum(att.seconds.get(c, 0.0) for c in STEP_CATEGORIES)
                 for run in report.runs for att in run.attempts)
    step_gpu_s = sum(report.gpu_s.get(c, 0.0) for c in STEP_CATEGORIES)
    peak = facts.peak_tflops * 1e12
    flops = flops_per_unit if flops_per_unit and done else None
    gpu_hours = report.allocated_gpu_s / 3600
    return Efficiency(
        unit=unit if done else "", work_done=done, work_kept=kept, step_s=step_s,
        throughput=done / step_s if done and step_s else None, flops_per_unit=flops,
        mfu=done * flops / (step_gpu_s * peak) if flops and step_gpu_s and peak else None,
        allocation_mfu=(kept * flops / (report.allocated_gpu_s * peak)
                        if flops and report.allocated_gpu_s and peak else None),
        gpu_hours=gpu_hours, cost=gpu_hours * facts.price if facts.price is not None else None,
        facts=facts, series=_series(report.points, units))


def _units_at(t: float, work: Sequence[tuple[float, float]]) -> float:
    """The units of a step completed at ``t``: the work said last before it (0 before any)."""
    said = [per_step for at, per_step in work if at <= t]
    return said[-1] if said else 0.0


def _series(points: Sequence[tuple[float, int, bool]], units: Sequence[float]
            ) -> list[tuple[float, float]]:
    """Throughput over time: units per second over windows of consecutive completions; a
    window across a gap (a restart, a requeue) is left out, so the plot breaks there."""
    times = [t for t, _, _ in points]
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    if not gaps or not any(units):
        return []
    long = 3 * statistics.median(gaps)
    size = max(1, len(points) // POINTS)
    out = []
    for i in range(1, len(points) - size + 1, size):
        span = times[i + size - 1] - times[i - 1]
        inside = times[i - 1:i + size]
        if span <= 0 or any(b - a > long for a, b in zip(inside, inside[1:])):
            continue
        out.append((times[i + size - 1], sum(units[i:i + size]) / span))
    return out
