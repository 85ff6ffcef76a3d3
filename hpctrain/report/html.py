"""A :class:`hpctrain.report.build.Report` as one self-contained HTML page (inline SVG, no
scripts, no network), readable offline on a login node. Pure.

One palette and one set of words for the whole page: the table of where the GPU-time
went, the timeline's lanes and its legend, and the steps plot all use the report's
categories (kept steps, redone steps, start-up, saving, stopping, other) in the same
colours, plus the queue wait (not allocated time). Red means one thing: work lost and done
again. The page says what goodput, runs and attempts are. With the measured efficiency
(:mod:`hpctrain.report.efficiency`) it adds throughput, MFU and cost beside ``hpctrain
plan``'s estimate, and the throughput over time on the timeline's axis.
"""

from __future__ import annotations

import statistics
from html import escape

from hpctrain.report.build import CATEGORIES, Attempt, Report
from hpctrain.report.efficiency import Efficiency

WIDTH, LANE, LEFT, RIGHT = 960, 34, 70, 90   # RIGHT: room for the last cause
COLORS = {"queue": "#8da4bd", "startup": "#f0b429", "kept": "#3f9142", "redone": "#c0392b",
          "saving": "#2f6fb0", "stopping": "#7d5ba6", "other": "#d4d4d4", "slow": "#e67e22"}
LABELS = {"queue": "queued (not allocated)", "startup": "start-up", "kept": "kept steps",
          "redone": "redone steps (lost work)", "saving": "saving", "stopping": "stopping",
          "other": "other", "slow": "slowed by a slow node"}
WORDS = (
    ("goodput", "the share of the allocated GPU-time (each run's elapsed time x its GPUs) "
                "spent on steps whose result was kept; the rest is in the table below"),
    ("run", "one start of the job by Slurm; each requeue (a preemption, the time limit, a "
            "lost node) starts the next run, after a wait in the queue"),
    ("attempt", "one start of the training step inside a run: after a hang or an allowed "
                "crash the job supervisor starts it again in the same allocation, in the "
                "running processes or new ones, without a requeue"),
    ("kept / redone steps", "a step whose result survived, or one done again because an "
                            "interruption lost it (red, here and in the plots)"),
    ("slowed", "the steps' time beyond the job's healthy pace while a node was found slow "
               "(orange: the stretch; the node in its tooltip and the table)"),
)


def to_html(r: Report, eff: Efficiency | None = None) -> str:
    """The whole page; ``eff``: the measured efficiency, when there is one."""
    good = "unknown" if r.goodput is None else f"{r.goodput:.1%}"
    rows = "".join(
        f"<tr><td>{run.restart}</td><td>{escape(run.state)}</td>"
        f"<td>{'-' if run.queue_s is None else f'{run.queue_s:.0f} s'}</td>"
        f"<td>{run.elapsed_s:.0f} s</td><td>{escape(run.nodes)}</td><td>{run.gpus}</td>"
        f"<td>{len(run.attempts)}</td><td>{escape(run.cause)}</td></tr>" for run in r.runs)
    spent = "".join(f"<tr><td>{_swatch(c)} {LABELS[c]}</td><td>{r.gpu_s[c]:.0f}</td>"
                    f"<td>{r.gpu_s[c] / r.allocated_gpu_s:.1%}</td></tr>"
                    for c in CATEGORIES if r.allocated_gpu_s)
    words = "".join(f"<dt>{w}</dt><dd>{escape(d)}</dd>" for w, d in WORDS)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>hpctrain report: job {escape(r.job)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:{WIDTH}px}}
table{{border-collapse:collapse}} td,th{{border:1px solid #bbb;padding:2px 8px;text-align:left}}
dt{{font-weight:bold;float:left;clear:left;width:11em}} dd{{margin-left:11em}}
.swatch{{display:inline-block;width:0.9em;height:0.9em;vertical-align:middle}}</style>
</head><body>
<h1>Job {escape(r.job)}</h1>
<p id="goodput">goodput: <b>{good}</b> of {r.allocated_gpu_s:.0f} GPU-s allocated;
{r.kept_steps} steps kept, {r.lost_steps} lost and re-done</p>
<dl id="words">{words}</dl>
<h2>Runs</h2>
<table id="runs"><tr><th>run</th><th>state</th><th>queued</th><th>ran</th><th>nodes</th>
<th>GPUs</th><th>attempts</th><th>ended</th></tr>{rows}</table>
<h2>Where the GPU-time went</h2>
<table id="spent"><tr><th>category</th><th>GPU-s</th><th>share</th></tr>{spent}</table>
<h2>Timeline</h2>
<p>One lane per run, in wall time; hover a bar for its attempt and seconds.</p>
{timeline(r)}
<h2>Steps over time</h2>
{steps_panel(r)}
{efficiency_section(r, eff) if eff is not None else ""}
</body></html>
"""


def _swatch(kind: str) -> str:
    return f'<span class="swatch" style="background:{COLORS[kind]}"></span>'


def _span(r: Report) -> tuple[float, float]:
    times = [t for run in r.runs for att in run.attempts for t in (att.begin, att.end)]
    times += [att.begin - (run.queue_s or 0) for run in r.runs for att in run.attempts[:1]]
    return (min(times), max(times)) if times else (0.0, 1.0)


def _axis(t0: float, t1: float, y: float) -> str:
    """Seconds since the first event, at a round interval, along ``y``."""
    span = max(t1 - t0, 1e-9)
    step = next((s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200,
                             21600, 43200, 86400) if span / s <= 10), 86400 * 7)
    scale = (WIDTH - LEFT - RIGHT) / span
    ticks = []
    for k in range(int(span // step) + 1):
        x = LEFT + k * step * scale
        label = f"{k * step // 60:.0f} min" if step >= 60 else f"{k * step:.0f} s"
        ticks.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#666"/>'
                     f'<text x="{x:.1f}" y="{y + 15}" font-size="10" text-anchor="middle">'
                     f"{label}</text>")
    return (f'<line x1="{LEFT}" y1="{y}" x2="{WIDTH - RIGHT}" y2="{y}" stroke="#666"/>'
            + "".join(ticks))


def _legend(kinds: tuple[str, ...], y: float, mark: str = "&#9632;") -> str:
    """The legend's words and colours: the table's (LABELS)."""
    items = " ".join(f'<tspan fill="{COLORS[k]}">{mark}</tspan><tspan> {LABELS[k]}  </tspan>'
                     for k in kinds)
    return f'<text x="{LEFT}" y="{y}" font-size="11">{items}</text>'


def timeline(r: Report) -> str:
    """One lane per run: the queue, then per attempt its start-up, its steps (kept or
    redone), saves and stopping; what none of them explains is the lane's grey (other)."""
    t0, t1 = _span(r)
    scale = (WIDTH - LEFT - RIGHT) / max(t1 - t0, 1e-9)

    def x(t: float) -> float:
        return LEFT + (t - t0) * scale

    parts = []
    for i, run in enumerate(r.runs):
        y = 20 + i * LANE
        parts.append(f'<text x="4" y="{y + 16}">run {run.restart}</text>')
        first, last = run.attempts[0], run.attempts[-1]
        parts.append(_rect(x(first.begin), x(last.end), y, "other",
                           f"run {run.restart}: {last.end - first.begin:.1f} s allocated"))
        if run.queue_s:
            parts.append(_rect(x(first.begin - run.queue_s), x(first.begin), y, "queue",
                               f"queued {run.queue_s:.0f} s (not allocated)"))
        for att in run.attempts:
            for a, b, kind in _segments(att, r.points):
                how = {"inprocess": " (in-process)", "new": " (new processes)"}.get(
                    att.mode, "") + (f" on {att.gpus} GPU(s), shrunk" if att.shrunk else "")
                parts.append(_rect(x(a), x(b), y, kind, f"attempt {att.attempt}{how}: "
                                   f"{LABELS[kind]} {b - a:.1f} s"))
            parts.append(f'<text x="{x(att.end) + 2:.1f}" y="{y + 30}" font-size="10" '
                         f'class="cause">{escape(att.cause)}</text>')
            if att.shrunk:        # the stretch at the smaller width, named on the lane
                parts.append(f'<text x="{x(att.begin) + 2:.1f}" y="{y - 2}" font-size="10" '
                             f'class="cause">shrunk to {att.gpus} GPU(s)</text>')
    axis_y = 20 + len(r.runs) * LANE + 6
    height = axis_y + 40
    return (f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{height}"><rect width="100%" height="100%" fill="white"/>'
            f'{"".join(parts)}{_axis(t0, t1, axis_y)}'
            f'{_legend(("queue", *CATEGORIES), height - 4)}</svg>')


def _segments(att: Attempt, points: list[tuple[float, int, bool]]
              ) -> list[tuple[float, float, str]]:
    """(from, to, category) of one attempt, in the report's categories: start-up, each run
    of kept or redone steps, stopping; then its saves (drawn over the steps they paused)."""
    if att.first_at is None or att.last_at is None:
        return [(att.begin, att.end, "startup"), *[(a, b, "saving") for a, b in att.saving]]
    mine = [(t, kept) for t, _, kept in points if att.first_at <= t <= att.last_at]
    gaps = [b - a for (a, _), (b, _) in zip(mine, mine[1:])]
    first = statistics.median(gaps) if gaps else 0.0
    out = [(att.begin, max(att.begin, att.first_at - first), "startup")]
    start = att.first_at - first
    for (t, kept), nxt in zip(mine, [*mine[1:], None]):
        kind = "kept" if kept else "redone"
        if nxt is None or ("kept" if nxt[1] else "redone") != kind:   # a run of one kind
            out.append((start, t, kind))
            start = t
    out.append((att.last_at, att.end, "stopping"))
    return [s for s in out if s[1] > s[0]] + [(a, b, "saving") for a, b in att.saving] + \
        [(a, b, "slow") for a, b, _, _ in att.slow]


def _rect(a: float, b: float, y: float, kind: str, title: str) -> str:
    return (f'<rect x="{a:.1f}" y="{y}" width="{max(b - a, 0.5):.1f}" height="20" '
            f'fill="{COLORS[kind]}" class="{kind}"><title>{escape(title)}</title></rect>')


def steps_panel(r: Report) -> str:
    """Step number over wall time: kept steps green, redone (lost) ones red."""
    if not r.points:
        return "<p>no step history (the script does not use hpctrain.runtime)</p>"
    t0, t1 = _span(r)
    top = max(s for _, s, _ in r.points) or 1
    height = 240
    sx = (WIDTH - LEFT - RIGHT) / max(t1 - t0, 1e-9)
    base = height - 40

    def y(step: int) -> float:
        return base - step / top * (base - 20)

    dots = "".join(f'<circle cx="{LEFT + (t - t0) * sx:.1f}" cy="{y(s):.1f}" '
                   f'r="2" fill="{COLORS["kept" if kept else "redone"]}"/>'
                   for t, s, kept in r.points)
    return (f'<svg id="steps" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{height}"><rect width="100%" height="100%" fill="white"/>'
            f'<text x="4" y="{y(top) + 4:.1f}" font-size="11">step {top}</text>'
            f'<text x="4" y="{base + 4}" font-size="11">step 0</text>{dots}'
            f'{_axis(t0, t1, base + 6)}{_legend(("kept", "redone"), height - 4, "&#9679;")}'
            "</svg>")


def efficiency_section(r: Report, eff: Efficiency) -> str:
    """Throughput, MFU, GPU-hours and cost, measured, beside plan's estimate; the
    throughput over time on the timeline's axis."""
    facts, est = eff.facts, eff.estimate
    note = (f"<p><b>CPU figures</b>: partition {escape(facts.partition)}'s GPUs are "
            "emulated (the devcluster), so the throughput is what its CPUs did, and the MFU "
            "is theirs against the peak of the GPU the partition stands in for.</p>"
            if facts.emulated else "")
    unit = escape(eff.unit) or "units"

    def money(value: float | None) -> str:
        return "-" if value is None else f"{value:.3g} {escape(facts.currency)}"

    def pct(value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value:.1%}" if value >= 0.001 else f"{value * 100:.2g}%"

    rows = [("throughput", "-" if eff.throughput is None else
             f"{eff.throughput:,.0f} {unit}/s while stepping", "-"),
            ("MFU", f"{pct(eff.mfu)} while stepping, {pct(eff.allocation_mfu)} of the "
                    f"allocation", "-" if est is None else f"{est.mfu:.0%} (assumed)"),
            ("GPU-hours", f"{eff.gpu_hours:.3g}", "-" if est is None else
             f"{est.gpu_hours:.3g}"),
            ("cost", money(eff.cost), "-" if est is None else money(est.cost))]
    table = "".join(f"<tr><td>{a}</td><td>{b}</td><td>{c}</td></tr>" for a, b, c in rows)
    peak = f"{facts.peak_tflops:g} TFLOPS per GPU" if facts.peak_tflops else "unknown"
    return f"""<h2>Throughput and cost</h2>
{note}<p>Measured from the {eff.work_done:,.0f} {unit} of the job's completed steps (the
script's <code>set_work</code>), against partition {escape(facts.partition or '?')}'s peak of
{peak}; <code>hpctrain plan</code>'s estimate is for the {eff.work_kept:,.0f} {unit} kept.</p>
<table id="efficiency"><tr><th></th><th>measured</th><th>plan's estimate</th></tr>{table}</table>
{throughput_panel(r, eff)}"""


def throughput_panel(r: Report, eff: Efficiency) -> str:
    """Throughput over wall time, on the timeline's axis; broken where the job was not
    stepping (a restart, a requeue)."""
    if not eff.series:
        return "<p>no throughput over time (the script did not say a step's work)</p>"
    t0, t1 = _span(r)
    height, base = 200, 160
    top = max(v for _, v in eff.series) or 1.0
    sx = (WIDTH - LEFT - RIGHT) / max(t1 - t0, 1e-9)
    times = [t for t, _ in eff.series]
    usual = statistics.median([b - a for a, b in zip(times, times[1:])] or [0.0])
    lines, current = [], []
    for i, (t, v) in enumerate(eff.series):
        if current and t - eff.series[i - 1][0] > 2 * usual:
            lines.append(current)
            current = []
        current.append(f"{LEFT + (t - t0) * sx:.1f},{base - v / top * (base - 20):.1f}")
    lines.append(current)
    drawn = "".join(f'<polyline points="{" ".join(pts)}" fill="none" '
                    f'stroke="{COLORS["kept"]}" stroke-width="1.5"/>' for pts in lines)
    return (f'<svg id="throughput" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{height}"><rect width="100%" height="100%" fill="white"/>'
            f'<text x="4" y="24" font-size="11">{top:,.0f}</text>'
            f'<text x="4" y="{base + 4}" font-size="11">0</text>{drawn}'
            f'{_axis(t0, t1, base + 6)}<text x="{LEFT}" y="{height - 4}" font-size="11">'
            f"{escape(eff.unit)} per second of wall time, over a few steps at a time"
            f"{' (CPU figures)' if eff.facts.emulated else ''}</text></svg>")
