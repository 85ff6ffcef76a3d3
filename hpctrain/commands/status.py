"""``hpctrain status [JOB_ID ...]``: the user's hpctrain jobs, with ONE batched Slurm call."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import click

from hpctrain.commands.jobview import format_cause, format_elapsed, format_requeues
from hpctrain.commands.options import job_ids as check_ids
from hpctrain.commands.table import table
from hpctrain.jobs import index
from hpctrain.jobs.contract import LIVE_S, MAX_POLL_S, backoff
from hpctrain.jobs.listing import Item, Listing, SweepSummary, collect
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


WATCH_RANGE_S = (1.0, 3600.0)   # --watch: at least a second, at most an hour


class _WatchSeconds(click.FloatRange):
    """``--watch``'s SECONDS: a finite number of seconds in WATCH_RANGE_S. ``inf`` (or
    ``1e400``) would overflow the sleep and ``nan`` passes every comparison (a watch that
    never sleeps), so both are refused by name, as a value out of the range is."""

    def __init__(self) -> None:
        super().__init__(*WATCH_RANGE_S)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        seconds = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(seconds):
            lo, hi = WATCH_RANGE_S
            self.fail(f"{value!r} is not a number of seconds from {lo:g} to {hi:g}.",
                      param, ctx)
        return super().convert(seconds, param, ctx)


@click.command()
@click.argument("job_ids", nargs=-1, metavar="[JOB_ID]...", callback=check_ids)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--expand", is_flag=True, help="Show every task of sweeps, not one row each.")
@click.option("--limit", default=20, show_default=True,
              help="Without JOB_IDs: how many of the most recent submissions to show.")
@click.option("--watch", "watch_s", type=_WatchSeconds(), default=None, is_flag=False,
              flag_value=5.0,
              metavar="[SECONDS]",
              help="Show the table again every SECONDS (default 5; 1 to 3600) until the jobs "
                   "have ended "
                   "or Ctrl-C, less often (up to 10 s) while nothing changes; in place on a "
                   "terminal, where running jobs' steps are shown again every 2 s in between.")
def status(job_ids: tuple[str, ...], as_json: bool, expand: bool, limit: int,
           watch_s: float | None) -> int:
    """State, elapsed time, nodes, requeues by cause, last checkpoint step and why the
    last run ended (the supervisor's verdict: a crash names its rank, node and error).

    Without JOB_IDs: the jobs this user submitted through hpctrain (the local job index).
    A sweep is one row with per-state counts; give its id (or --expand) for its tasks.
    """
    if watch_s is None:
        _show(collect(job_ids, expand, limit), job_ids, as_json)
        return 0
    return _watch(job_ids, as_json, expand, limit, watch_s)


def _watch(job_ids: tuple[str, ...], as_json: bool, expand: bool, limit: int,
           every_s: float) -> int:
    """The table again until every job has ended (or Ctrl-C). Slurm is asked every
    ``every_s`` after a change and less often while nothing changes (``backoff``, as
    ``submit --wait``: many watchers are load on slurmdbd); the footer says when next.
    On a terminal the running jobs' steps are shown again every LIVE_S between Slurm's
    polls (their supervisors are asked, not Slurm); a log gets one table per poll."""
    tty = sys.stdout.isatty()
    snap, seen, pause, next_poll = None, None, every_s, 0.0
    try:
        while True:
            started = time.monotonic()
            polled = started >= next_poll
            listing = collect(job_ids, expand, limit, None if polled else snap)
            snap = listing.snapshot
            if polled:
                word = listing.slurm_word()
                pause, seen = backoff(pause, every_s, word != seen), word
                next_poll = started + pause
            if tty:
                click.echo("\033[H\033[J", nl=False)   # clear the screen, then the table
            if tty or polled:
                _show(listing, job_ids, as_json)
            if polled and listing.ended():
                return 0
            until_poll = max(0.0, next_poll - time.monotonic())
            if tty or polled:
                click.echo(_next_look(until_poll, pause, every_s), err=as_json)
            time.sleep(min(LIVE_S, until_poll) if tty else until_poll)
    except KeyboardInterrupt:
        return 0


def _next_look(until_s: float, pause_s: float, every_s: float) -> str:
    """The watch's footer: when Slurm is asked next, and how often it is asked now (a
    user who sees it slow down knows why, and that a change brings it back)."""
    how = f"every {pause_s:.3g} s"
    if every_s < MAX_POLL_S:
        how = (f"now {how}: {every_s:g} s after a change, up to {MAX_POLL_S:g} s while "
               "nothing changes")
    return f"next look at Slurm in {math.ceil(round(until_s, 1))} s ({how}; Ctrl-C stops)"


def _show(listing: Listing, job_ids: tuple[str, ...], as_json: bool) -> None:
    """One table (or JSON object)."""
    if as_json:
        click.echo(json.dumps(listing.to_json()))
        return
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
    if view.slow_nodes:      # found slow: the node and its factor ("-": the whole job)
        nodes += " (slow " + ",".join(          # factor 0: it failed the preflight check
            f"{'job' if n == '-' else n} " + (f"{f:.1f}x" if f else "failed the preflight")
            for n, f in view.slow_nodes.items()) + ")"
    if view.shrunk:          # on fewer nodes since a node was lost with no spare left
        nodes += f" (shrunk to {view.shrunk[0]} of {view.shrunk[1]} GPUs)"
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
