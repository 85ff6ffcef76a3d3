"""``hpctrain status [JOB_ID ...]``: the user's hpctrain jobs, with ONE batched Slurm call."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import click

from hpctrain import protocol, records, watcher
from hpctrain.commands.jobview import (format_cause, format_elapsed, format_requeues,
                                       info_json, live_progress)
from hpctrain.ledger import read_ledger, requeues_by_cause
from hpctrain.records import JobRecord
from hpctrain.slurm.states import ORDER
from hpctrain.sweep import point_checkpoint_dir
from hpctrain.watcher import JobInfo, Snapshot


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

    Without JOB_IDs: the jobs this user submitted through hpctrain (local record).
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
    targets = _targets(job_ids, limit)
    expand_ids = set(job_ids) if job_ids else set()
    ids = [t.job_id for t, _ in targets]
    snap = watcher.poll(ids)
    rows = []
    for rec, given in targets:
        if rec.kind == "sweep":
            rows += _sweep_rows(rec, targets, snap, expand or rec.sweep_id in expand_ids
                                or given in expand_ids)
        else:
            rows.append(_job_row(given, rec, snap))
    rows = [r for r in rows if r is not None]
    if as_json:
        click.echo(json.dumps({"source": snap.source, "note": snap.note,
                               "slurm_calls": snap.calls, "jobs": [r.detail for r in rows]}))
    else:
        if snap.note:
            click.echo(f"note: {snap.note}", err=True)
        click.echo(_table(rows) if rows else "no hpctrain jobs recorded yet "
                   f"({records.record_path()}); submit one with `hpctrain submit SPEC`")
    if watching:
        return int(all(_info(g, t, snap).state.final for t, g in targets))
    return 0


def _targets(job_ids: tuple[str, ...], limit: int) -> list[tuple[JobRecord, str]]:
    """(record, id as given) for the requested jobs, or the recent submissions."""
    if not job_ids:
        return [(r, r.job_id) for r in records.load(limit)]
    out = []
    for jid in job_ids:
        rec = records.find(jid)
        if rec is not None and rec.kind == "sweep" and rec.sweep_id == jid:
            out += [(r, jid) for r in records.sweep_members(jid)]
        else:
            # a job hpctrain did not submit still gets its Slurm state
            out.append((rec or JobRecord(job_id=jid.split("_")[0], name="", kind="other",
                                         folder=""), jid))
    return out


def _job_row(job_id: str, rec: JobRecord, snap: Snapshot) -> Row:
    info = _info(job_id, rec, snap)
    step = watcher.last_checkpoint_step(rec.checkpoint_dir)
    dirs = (rec.checkpoint_dir, rec.extra.get("submit_dir", ""))
    # the supervisor's verdict on the last run (cause, failing rank and node, error)
    verdict = protocol.find_record(job_id, protocol.OUTCOME, *dirs)
    ledger = read_ledger(job_id, *dirs)
    requeues = requeues_by_cause(info.requeues, ledger)
    limit = ledger.limit if ledger is not None else None
    in_place = ledger.restarts if ledger is not None else {}
    excluded = ledger.excluded if ledger is not None else {}
    cause = f"requeue limit {limit} reached" if limit else format_cause(verdict)
    live = live_progress(job_id, *dirs) if str(info.state) == "RUNNING" else ""
    cell = format_requeues(requeues)
    if in_place:   # restarts of the step inside the allocation (the hang watchdog's)
        cell = ("" if cell == "-" else cell + " ") + "in-place " + format_requeues(in_place)
    nodes = info.nodes or "-"
    if excluded:
        nodes += f" (excluded {','.join(excluded)})"
    state = f"{info.state} {live}" if live else str(info.state)
    return Row(job_id, info.name or rec.name, state, format_elapsed(info.elapsed_s),
               nodes, cell, "-" if step is None else str(step), cause,
               {"job_id": job_id, "name": info.name or rec.name, "kind": rec.kind,
                **info_json(info), "requeues": requeues, "requeue_limit": limit,
                "restarts_in_place": in_place, "excluded_nodes": excluded, "progress": live,
                "hangs": (ledger.recoveries("hang") if ledger is not None else 0),
                "last_checkpoint_step": step, "folder": rec.folder,
                "cause": verdict.get("cause"), "verdict": verdict})


def _info(job_id: str, rec: JobRecord, snap: Snapshot) -> JobInfo:
    if job_id in snap.infos:
        return snap.infos[job_id]
    if snap.source == "squeue":
        return watcher.ended_without_accounting(job_id, rec.folder)
    return snap.get(job_id)


def _sweep_rows(rec: JobRecord, targets: list[tuple[JobRecord, str]], snap: Snapshot,
                expand: bool) -> list[Row]:
    """A sweep as one row (first array only; its siblings fold in), or one row per task."""
    members = [r for r, _ in targets if r.sweep_id == rec.sweep_id]
    tasks: list[tuple[str, JobRecord, int]] = []
    for m in members:
        tasks += [(f"{m.job_id}_{t}", m, t) for t in range(m.num_tasks)]
    if expand:
        rows = []
        for tid, m, t in tasks:
            ckpt = point_checkpoint_dir(m, t)
            row = _job_row(tid, JobRecord(**{**m.__dict__, "checkpoint_dir": ckpt}), snap)
            point = m.points[t] if t < len(m.points) else {}
            row.name = ",".join(f"{k}={v}" for k, v in point.items()) or row.name
            row.detail["point"] = point
            rows.append(row)
        return rows if rec is members[0] else []
    if rec is not members[0]:
        return []
    counts: dict[str, int] = {}
    for tid, m, _ in tasks:
        state = str(_info(tid, m, snap).state)
        counts[state] = counts.get(state, 0) + 1
    summary = " ".join(f"{s}:{counts[s]}" for s in ORDER if s in counts)
    return [Row(rec.sweep_id, f"{rec.name} (sweep, {len(tasks)} points)", summary,
                detail={"job_id": rec.sweep_id, "name": rec.name, "kind": "sweep",
                        "arrays": [m.job_id for m in members], "points": len(tasks),
                        "state_counts": counts})]


def _table(rows: list[Row]) -> str:
    head = Row("JOBID", "NAME", "STATE", "ELAPSED", "NODES", "REQUEUES", "CKPT", "CAUSE")
    cols = ("job_id", "name", "state", "elapsed", "nodes", "requeues", "ckpt", "cause")
    all_rows = [head, *rows]
    widths = {c: min(48, max(len(str(getattr(r, c))) for r in all_rows)) for c in cols}
    return "\n".join("  ".join(str(getattr(r, c))[:48].ljust(widths[c]) for c in cols).rstrip()
                     for r in all_rows)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(status())
