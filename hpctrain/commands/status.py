"""``hpctrain status [JOB_ID ...]``: the user's hpctrain jobs, with ONE batched Slurm call."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import click

from hpctrain.commands.jobview import format_cause, format_elapsed, format_requeues
from hpctrain.commands.options import job_ids as check_ids
from hpctrain.commands.table import table
from hpctrain.jobs import index
from hpctrain.jobs.listing import Item, SweepSummary, collect
from hpctrain.jobs.view import JobStatus
from hpctrain.slurm.states import ORDER


@dataclass
class Row:
    """One line of the status table: a job, a sweep task, or a whole sweep."""

    job_id: str
    name: str
    state: str
    elapsed: str = "-"
    nodes: str = "-"
    requeues: str = "-"
    ckpt: str = "-"
    cause: str = "-"
    detail: dict[str, Any] = field(default_factory=dict)


@click.command()
@click.argument("job_ids", nargs=-1, metavar="[JOB_ID]...", callback=check_ids)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--expand", is_flag=True, help="Show every task of sweeps, not one row each.")
@click.option("--limit", default=20, show_default=True,
              help="Without JOB_IDs: how many of the most recent submissions to show.")
@click.option("--watch", "watch_s", type=float, default=None, is_flag=False, flag_value=5.0,
              metavar="[SECONDS]",
              help="Show the table again every SECONDS (default 5) until the jobs have ended "
                   "or Ctrl-C; in place on a terminal.")
def status(job_ids: tuple[str, ...], as_json: bool, expand: bool, limit: int,
           watch_s: float | None) -> int:
    """State, elapsed time, nodes, requeues by cause, last checkpoint step and why the
    last run ended (the supervisor's verdict: a crash names its rank, node and error).

    Without JOB_IDs: the jobs this user submitted through hpctrain (the local job index).
    A sweep is one row with per-state counts; give its id (or --expand) for its tasks.
    """
    if watch_s is None:
        return _once(job_ids, as_json, expand, limit)
    tty = sys.stdout.isatty()
    try:
        while True:
            if tty:
                click.echo("\033[H\033[J", nl=False)   # clear the screen, then the table
            if _once(job_ids, as_json, expand, limit, watching=True):
                return 0
            time.sleep(max(watch_s, 1.0))
    except KeyboardInterrupt:
        return 0


def _once(job_ids: tuple[str, ...], as_json: bool, expand: bool, limit: int,
          watching: bool = False) -> int:
    """One table (or JSON object). Watching: 1 once every job has ended, else 0."""
    listing = collect(job_ids, expand, limit)
    if as_json:
        click.echo(json.dumps(listing.to_json()))
    else:
        snap = listing.snapshot
        if snap.note:
            click.echo(f"note: {snap.note}", err=True)
        rows = [_row(item) for item in listing.items]
        click.echo(_table(rows) if rows else "no hpctrain jobs recorded yet "
                   f"({index.index_path()}); submit one with `hpctrain submit SPEC`")
        if job_ids:   # the jobs asked for by id: what identifies their runs and code
            for r in rows:
                ident = [f"{k}={r.detail[k]}" for k in ("run_id", "snapshot") if r.detail.get(k)]
                if ident:
                    click.echo(f"  {r.job_id}: {' '.join(ident)}")
    if watching:
        return int(listing.ended())
    return 0


def _row(item: Item) -> Row:
    return _sweep_row(item) if isinstance(item, SweepSummary) else _job_row(item)


def _job_row(view: JobStatus) -> Row:
    info = view.info
    limit = view.requeue_limit
    cause = f"requeue limit {limit} reached" if limit else format_cause(view.verdict)
    cell = format_requeues(info.requeues)
    if view.restarts_in_place:   # restarts of the step inside the allocation (the watchdog's)
        cell = (("" if cell == "-" else cell + " ") + "in-place "
                + format_requeues(view.restarts_in_place))
        if view.restarts_in_process:   # of those, in the running processes (seconds each)
            cell += f" ({sum(view.restarts_in_process.values())} in-process)"
    nodes = info.nodes or "-"
    if view.excluded_nodes:
        nodes += f" (excluded {','.join(view.excluded_nodes)})"
    state = f"{info.state} {view.live}" if view.live else str(info.state)
    name = info.name or view.entry.name
    if view.point is not None:   # a sweep task: its overrides say which it is
        name = ",".join(f"{k}={v}" for k, v in view.point.items()) or name
    return Row(view.job_id, name, state, format_elapsed(info.elapsed_s), nodes,
               cell, "-" if view.last_step is None else str(view.last_step), cause,
               view.to_json())


def _sweep_row(sweep: SweepSummary) -> Row:
    summary = " ".join(f"{s}:{sweep.counts[s]}" for s in ORDER if s in sweep.counts)
    return Row(sweep.sweep_id, f"{sweep.name} (sweep, {sweep.points} points)", summary,
               detail=sweep.to_json())


def _table(rows: list[Row]) -> str:
    cols = ("job_id", "name", "state", "elapsed", "nodes", "requeues", "ckpt", "cause")
    return table(["JOBID", "NAME", "STATE", "ELAPSED", "NODES", "REQUEUES", "CKPT", "CAUSE"],
                 [[getattr(r, c) for c in cols] for r in rows])
