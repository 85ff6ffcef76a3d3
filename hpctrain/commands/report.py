"""``hpctrain report JOB [--json] [--html FILE]``: where a job's GPU-time went, run by run,
and what its steps did with it.

Gathers sacct's runs (one call, :mod:`hpctrain.jobs.accounting`), the job's ledger and
outcome, and rank 0's progress history from the job's state directory
(:mod:`hpctrain.jobs.statedir`), then :func:`hpctrain.report.build.build` (pure) does the
accounting, :mod:`hpctrain.commands.report_efficiency` the measured throughput, MFU and
cost, and :mod:`hpctrain.report.html` draws the timeline. No torch.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

import click

from hpctrain import protocol
from hpctrain.commands.options import job_ids as check_ids, json_option
from hpctrain.errors import ReportError
from hpctrain.jobs import index, statedir
from hpctrain.commands.report_efficiency import efficiency, text_lines
from hpctrain.jobs.accounting import job_runs
from hpctrain.protocol.records import Verdict
from hpctrain.report.build import CATEGORIES, Report, RunFacts, build


@click.command()
@click.argument("job_id", required=False, callback=check_ids)
@json_option
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None,
              help="Also write a self-contained HTML page with the timeline to FILE.")
@click.option("--dir", "base", type=click.Path(file_okay=False), default=None,
              help="The job's checkpoint dir (or submit dir) when hpctrain did not submit it.")
@click.option("--partition", default=None,
              help="Instead of one job: a partition's requeues by cause, GPU-hours and "
                   "goodput per account, emergency saves against GraceTime.")
@click.option("--since", default="7d", show_default=True,
              help="With --partition: how far back (7d, 12h, or a date 2026-11-01).")
def report(job_id: str | None, as_json: bool, html: str | None, base: str | None,
           partition: str | None, since: str) -> int:
    """Runs, causes, start-up, lost work, saves and goodput of JOB_ID (123, or 123_4);
    or, with --partition, of a partition over a period (for its sysadmins)."""
    if partition:
        from hpctrain.commands.report_partition import partition_report

        return partition_report(partition, since, as_json)
    if not job_id:
        raise ReportError("give a JOB_ID (or --partition P for a partition's report)")
    rec = index.find(job_id)
    if rec is not None and rec.kind == "sweep" and rec.sweep_id == job_id:
        return sweep_report(job_id, as_json)
    state = state_dir(job_id, base)
    history = protocol.read_history(state)
    runs = job_runs(job_id).get(job_id, [])
    result = job_report(job_id, state, runs, history)
    entry = statedir.entry_of(job_id)
    # where it ran, as sacct says (a job hpctrain did not submit too), else its entry
    partition = runs[-1].partition if runs and runs[-1].partition else \
        (entry.partition if entry is not None else "")
    measured = efficiency(result, history, partition)
    if html:
        from hpctrain.report.html import to_html

        Path(html).write_text(to_html(result, measured), encoding="utf-8")
    if as_json:
        click.echo(json.dumps({**result.to_json(), "efficiency": asdict(measured)}))
    else:
        click.echo(format_text(result))
        click.echo("\n".join(text_lines(measured)))
        if html:
            click.echo(f"timeline: {html}")
    return 0


def job_report(key: str, state: Path, runs: list[RunFacts] | None = None,
               history: list[dict] | None = None) -> Report:
    """One job's (or sweep point's) report from Slurm (``runs``: already asked) and its
    state directory (``history``: rank 0's, already read)."""
    if runs is None:
        runs = job_runs(key).get(key, [])
    verdict = Verdict.parse(protocol.read_record(state / protocol.OUTCOME)) or Verdict()
    return build(key, runs, statedir.ledger_lines(state),
                 protocol.read_history(state) if history is None else history, verdict.cause,
                 verdict.detail if verdict.cause == "completed" else "")


def sweep_report(sweep_id: str, as_json: bool) -> int:
    """A sweep: one line per point, then the totals."""
    members = index.sweep_members(sweep_id)
    runs = job_runs(*(m.job_id for m in members))   # every task of every array at once
    points = []
    for member in members:
        for task in range(member.num_tasks):
            key = f"{member.job_id}_{task}"
            state = statedir.entry_state_dir(key, statedir.task_entry(member, task))
            point = member.points[task] if task < len(member.points) else {}
            points.append((key, point, job_report(key, state, runs.get(key, []))
                           if state else None))
    known = [r for _, _, r in points if r is not None and r.goodput is not None]
    allocated = sum(r.allocated_gpu_s for r in known)
    total = sum(r.gpu_s["kept"] for r in known) / allocated if allocated else None
    if as_json:
        click.echo(json.dumps({"sweep": sweep_id, "goodput": total, "points": [
            {"job_id": key, "point": point, "report": r.to_json() if r else None}
            for key, point, r in points]}))
        return 0
    for key, point, r in points:
        where = ",".join(f"{k}={v}" for k, v in point.items())
        if r is None:
            click.echo(f"{key:<10} {where}: no state directory (never started?)")
            continue
        good = "unknown" if r.goodput is None else f"{r.goodput:.1%}"
        click.echo(f"{key:<10} {where}: {len(r.runs)} run(s), ended "
                   f"{r.runs[-1].cause if r.runs else '-'}, goodput {good}")
    click.echo(f"sweep {sweep_id}: {len(points)} point(s), goodput "
               f"{'unknown' if total is None else f'{total:.1%}'} over the points with a "
               "progress history")
    return 0


def state_dir(job_id: str, base: str | None) -> Path:
    """The state directory of ``job_id`` (under ``--dir``, else where hpctrain put it);
    ReportError naming where it was looked for when there is none."""
    found = statedir.lookup(job_id, base or "")
    if found is None:
        bases = [b for b in statedir.search_bases(job_id, base or "") if b]
        raise ReportError(f"no state directory of job {job_id} found under "
                          f"{', '.join(bases) or 'any known directory'}: give "
                          "the job's checkpoint dir (or submit dir) with --dir")
    return found


HOW = {"inprocess": "in-process", "new": "in new processes"}   # how an attempt began


def format_text(r: Report) -> str:
    """The report as a few aligned lines."""
    lines = [f"job {r.job}: {len(r.runs)} run(s)"]
    for run in r.runs:
        queue = "-" if run.queue_s is None else f"{run.queue_s:.0f} s"
        lines.append(f"  run {run.restart}: {run.state:<10} queued {queue:>7}, ran "
                     f"{run.elapsed_s:.0f} s on {run.nodes or '-'} ({run.gpus} GPU), "
                     f"ended: {run.cause or '-'}")
        for att in run.attempts:
            s = att.seconds
            steps = (f"steps {att.first_step}..{att.last_step} ({att.steps}, {att.redone} "
                     "re-done)" if att.steps else "no step reported")
            how = f" ({HOW[att.mode]}" + (f", back in {att.recovery_s:.1f} s)"
                                          if att.recovery_s is not None else ")") \
                if att.mode else ""
            if att.shrunk:
                how += f" on {att.gpus} GPU(s), shrunk: no spare left"
            lines.append(f"    attempt {att.attempt}{how}: start-up "
                         f"{s.get('startup', 0):.1f} s, {steps}, saving "
                         f"{s.get('saving', 0):.1f} s, stopping {s.get('stopping', 0):.1f} s, "
                         f"ended: {att.cause or '-'}")
    restarts = [f"{len(r.restarts(mode))} {HOW[mode]}" + (
        f" (median {statistics.median(times):.1f} s from the last step before to the first "
        "after)" if (times := r.recoveries(mode)) else "") for mode in HOW if r.restarts(mode)]
    if restarts:
        lines.append(f"  restarts in the allocation: {'; '.join(restarts)}")
    if r.spare_gpu_s or r.spare_restarts:
        share = f"{r.spare_gpu_s / r.allocated_gpu_s:.1%} of" if r.allocated_gpu_s else "of"
        lines.append(f"  spare nodes: held {r.spare_gpu_s:.0f} GPU-s idle ({share} the "
                     f"allocation); {r.spare_restarts} lost node(s) replaced by a spare in "
                     "the allocation (each a requeue without one)")
    if r.shrinks:
        lines.append(f"  shrunk: {r.shrinks} lost node(s) recovered on fewer nodes in the "
                     "allocation, no spare left ([elastic] min_nodes; each a requeue "
                     "without it); the attempts after count their fewer GPUs")
    if r.slow_by_node:
        lines.append("  slow nodes: " + ", ".join(
            f"{'the whole job' if n == '-' else n} {s:.0f} GPU-s" for n, s in
            r.slow_by_node.items()) + " (the steps' time beyond the healthy pace while "
            "it was slow)")
    if r.note:
        lines.append(f"  the work was done, then: {r.note}")
    if r.goodput is None:
        lines.append("goodput: unknown (no progress history: the script does not use "
                     "hpctrain.runtime)")
    else:
        parts = ", ".join(f"{c} {r.gpu_s[c] / r.allocated_gpu_s:.1%}" for c in CATEGORIES
                          if c != "kept" and (c != "slow" or r.gpu_s[c]))
        lines.append(f"goodput: {r.goodput:.1%} of {r.allocated_gpu_s:.0f} GPU-s allocated "
                     f"({r.kept_steps} steps kept, {r.lost_steps} lost and re-done); "
                     f"the rest: {parts}")
    return "\n".join(lines)
