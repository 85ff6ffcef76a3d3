"""A :class:`hpctrain.report.build.Report` as one self-contained HTML page (inline SVG, no
scripts, no network), readable offline on a login node. Pure.

Two panels: one lane per run (queue wait, start-up, training, stopping, each attempt's
end and cause), and the steps over wall time, where work lost to an interruption shows
as steps done again (drawn in red).
"""

from __future__ import annotations

from html import escape

from hpctrain.report.build import CATEGORIES, Report

WIDTH, LANE, LEFT, RIGHT = 960, 34, 70, 90   # RIGHT: room for the last cause
COLORS = {"queue": "#d9d9d9", "startup": "#f0b429", "training": "#3f9142",
          "stopping": "#c0392b", "kept": "#3f9142", "redone": "#c0392b"}


def to_html(r: Report) -> str:
    """The whole page."""
    good = "unknown" if r.goodput is None else f"{r.goodput:.1%}"
    rows = "".join(
        f"<tr><td>{run.restart}</td><td>{escape(run.state)}</td>"
        f"<td>{'-' if run.queue_s is None else f'{run.queue_s:.0f} s'}</td>"
        f"<td>{run.elapsed_s:.0f} s</td><td>{escape(run.nodes)}</td><td>{run.gpus}</td>"
        f"<td>{len(run.attempts)}</td><td>{escape(run.cause)}</td></tr>" for run in r.runs)
    spent = "".join(f"<tr><td>{c}</td><td>{r.gpu_s[c]:.0f}</td>"
                    f"<td>{r.gpu_s[c] / r.allocated_gpu_s:.1%}</td></tr>"
                    for c in CATEGORIES if r.allocated_gpu_s)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>hpctrain report: job {escape(r.job)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #bbb;padding:2px 8px;text-align:left}}</style></head><body>
<h1>Job {escape(r.job)}</h1>
<p id="goodput">goodput: <b>{good}</b> of {r.allocated_gpu_s:.0f} GPU-s allocated;
{r.kept_steps} steps kept, {r.lost_steps} lost and re-done</p>
<h2>Runs</h2>
<table id="runs"><tr><th>run</th><th>state</th><th>queued</th><th>ran</th><th>nodes</th>
<th>GPUs</th><th>attempts</th><th>ended</th></tr>{rows}</table>
<h2>Where the GPU-time went</h2>
<table id="spent"><tr><th>category</th><th>GPU-s</th><th>share</th></tr>{spent}</table>
<h2>Timeline</h2>
{timeline(r)}
<h2>Steps over time</h2>
{steps_panel(r)}
</body></html>
"""


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


def timeline(r: Report) -> str:
    """One lane per run: queue, then per attempt start-up, training, stopping."""
    t0, t1 = _span(r)
    scale = (WIDTH - LEFT - RIGHT) / max(t1 - t0, 1e-9)

    def x(t: float) -> float:
        return LEFT + (t - t0) * scale

    parts = []
    for i, run in enumerate(r.runs):
        y = 20 + i * LANE
        parts.append(f'<text x="4" y="{y + 16}">run {run.restart}</text>')
        first = run.attempts[0]
        if run.queue_s:
            parts.append(_rect(x(first.begin - run.queue_s), x(first.begin), y, "queue",
                               f"queued {run.queue_s:.0f} s"))
        for att in run.attempts:
            marks = [att.begin, att.first_at or att.end, att.last_at or att.end, att.end]
            for (a, b), kind in zip(zip(marks, marks[1:]), ("startup", "training", "stopping")):
                if b > a:
                    how = {"inprocess": " (in-process)", "new": " (new processes)"}.get(
                        att.mode, "")
                    parts.append(_rect(x(a), x(b), y, kind,
                                       f"attempt {att.attempt}{how}: {kind} {b - a:.1f} s"))
            parts.append(f'<text x="{x(att.end) + 2:.1f}" y="{y + 30}" font-size="10" '
                         f'class="cause">{escape(att.cause)}</text>')
    axis_y = 20 + len(r.runs) * LANE + 6
    height = axis_y + 40
    legend = " ".join(f'<tspan fill="{COLORS[k]}">&#9632; {k}</tspan>'
                      for k in ("queue", "startup", "training", "stopping"))
    return (f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{height}"><rect width="100%" height="100%" fill="white"/>'
            f'{"".join(parts)}{_axis(t0, t1, axis_y)}<text x="{LEFT}" y="{height - 4}" '
            f'font-size="11">{legend}</text></svg>')


def _rect(a: float, b: float, y: float, kind: str, title: str) -> str:
    return (f'<rect x="{a:.1f}" y="{y}" width="{max(b - a, 0.5):.1f}" height="20" '
            f'fill="{COLORS[kind]}" class="{kind}"><title>{escape(title)}</title></rect>')


def steps_panel(r: Report) -> str:
    """Step number over wall time: kept steps green, re-done (lost) ones red."""
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
    legend = (f'<tspan fill="{COLORS["kept"]}">&#9679; kept</tspan> '
              f'<tspan fill="{COLORS["redone"]}">&#9679; done again (lost work)</tspan>')
    return (f'<svg id="steps" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{height}"><rect width="100%" height="100%" fill="white"/>'
            f'<text x="4" y="{y(top) + 4:.1f}" font-size="11">step {top}</text>'
            f'<text x="4" y="{base + 4}" font-size="11">step 0</text>{dots}'
            f'{_axis(t0, t1, base + 6)}<text x="{LEFT}" y="{height - 4}" font-size="11">'
            f"{legend}</text></svg>")
