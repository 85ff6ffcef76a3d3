"""``hpctrain status [JOB_ID ...]``: the user's hpctrain jobs, with ONE batched Slurm call."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import click

from hpctrain.commands.jobview import format_cause, format_elapsed, format_requeues
from hpctrain.commands.table import table
from hpctrain.jobs import index, poll
from hpctrain.jobs.index import JobEntry
from hpctrain.jobs.poll import Snapshot
from hpctrain.jobs.sweep import point_checkpoint_dir
from hpctrain.jobs.view import job_status, slurm_info
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
@click.argument("job_ids", nargs=-1, metavar="[JOB_ID]...")
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
    targets, snap, rows = _collect(job_ids, expand, limit)
    if as_json:
        click.echo(json.dumps(_json(snap, rows)))
    else:
        if snap.note:
            click.echo(f"note: {snap.note}", err=True)
        click.echo(_table(rows) if rows else "no hpctrain jobs recorded yet "
                   f"({index.index_path()}); submit one with `hpctrain submit SPEC`")
        if job_ids:   # the jobs asked for by id: what identifies their runs and code
            for r in rows:
                ident = [f"{k}={r.detail[k]}" for k in ("run_id", "snapshot") if r.detail.get(k)]
                if ident:
                    click.echo(f"  {r.job_id}: {' '.join(ident)}")
    if watching:
        return int(all(slurm_info(g, t, snap).state.final for t, g in targets))
    return 0


def _collect(job_ids: tuple[str, ...], expand: bool, limit: int
             ) -> tuple[list[tuple[JobEntry, str]], Snapshot, list[Row]]:
    targets = _targets(job_ids, limit)
    expand_ids = set(job_ids) if job_ids else set()
    snap = poll.snapshot([t.job_id for t, _ in targets])
    rows = []
    for rec, given in targets:
        if rec.kind == "sweep":
            rows += _sweep_rows(rec, targets, snap, expand or rec.sweep_id in expand_ids
                                or given in expand_ids)
        else:
            rows.append(_job_row(given, rec, snap))
    return targets, snap, [r for r in rows if r is not None]


def _json(snap: Snapshot, rows: list[Row]) -> dict[str, Any]:
    return {"source": snap.source, "note": snap.note, "slurm_calls": snap.calls,
            "jobs": [r.detail for r in rows]}


def status_json(job_ids: tuple[str, ...] = (), expand: bool = False,
                limit: int = 20) -> dict[str, Any]:
    """What ``hpctrain status --json`` prints (the Python API's ``Cluster().status()``)."""
    _, snap, rows = _collect(job_ids, expand, limit)
    return _json(snap, rows)


def _targets(job_ids: tuple[str, ...], limit: int) -> list[tuple[JobEntry, str]]:
    """(record, id as given) for the requested jobs, or the recent submissions."""
    if not job_ids:
        return [(r, r.job_id) for r in index.load(limit)]
    out = []
    for jid in job_ids:
        rec = index.find(jid)
        if rec is not None and rec.kind == "sweep" and rec.sweep_id == jid:
            out += [(r, jid) for r in index.sweep_members(jid)]
        else:
            # a job hpctrain did not submit still gets its Slurm state
            out.append((rec or JobEntry(job_id=jid.split("_")[0], name="", kind="other",
                                         folder=""), jid))
    return out


def _job_row(job_id: str, rec: JobEntry, snap: Snapshot) -> Row:
    view = job_status(job_id, rec, snap)
    info = view.info
    limit = view.requeue_limit
    cause = f"requeue limit {limit} reached" if limit else format_cause(view.verdict)
    cell = format_requeues(info.requeues)
    if view.restarts_in_place:   # restarts of the step inside the allocation (the watchdog's)
        cell = (("" if cell == "-" else cell + " ") + "in-place "
                + format_requeues(view.restarts_in_place))
    nodes = info.nodes or "-"
    if view.excluded_nodes:
        nodes += f" (excluded {','.join(view.excluded_nodes)})"
    state = f"{info.state} {view.live}" if view.live else str(info.state)
    return Row(job_id, info.name or rec.name, state, format_elapsed(info.elapsed_s), nodes,
               cell, "-" if view.last_step is None else str(view.last_step), cause,
               view.to_json())


def _sweep_rows(rec: JobEntry, targets: list[tuple[JobEntry, str]], snap: Snapshot,
                expand: bool) -> list[Row]:
    """A sweep as one row (first array only; its siblings fold in), or one row per task."""
    members = [r for r, _ in targets if r.sweep_id == rec.sweep_id]
    tasks: list[tuple[str, JobEntry, int]] = []
    for m in members:
        tasks += [(f"{m.job_id}_{t}", m, t) for t in range(m.num_tasks)]
    if expand:
        rows = []
        for tid, m, t in tasks:
            ckpt = point_checkpoint_dir(m, t)
            row = _job_row(tid, JobEntry(**{**m.__dict__, "checkpoint_dir": ckpt}), snap)
            point = m.points[t] if t < len(m.points) else {}
            row.name = ",".join(f"{k}={v}" for k, v in point.items()) or row.name
            row.detail["point"] = point
            rows.append(row)
        return rows if rec is members[0] else []
    if rec is not members[0]:
        return []
    counts: dict[str, int] = {}
    for tid, m, _ in tasks:
        state = str(slurm_info(tid, m, snap).state)
        counts[state] = counts.get(state, 0) + 1
    summary = " ".join(f"{s}:{counts[s]}" for s in ORDER if s in counts)
    return [Row(rec.sweep_id, f"{rec.name} (sweep, {len(tasks)} points)", summary,
                detail={"job_id": rec.sweep_id, "name": rec.name, "kind": "sweep",
                        "arrays": [m.job_id for m in members], "points": len(tasks),
                        "state_counts": counts})]


def _table(rows: list[Row]) -> str:
    cols = ("job_id", "name", "state", "elapsed", "nodes", "requeues", "ckpt", "cause")
    return table(["JOBID", "NAME", "STATE", "ELAPSED", "NODES", "REQUEUES", "CKPT", "CAUSE"],
                 [[getattr(r, c) for c in cols] for r in rows])
