"""What ``hpctrain status`` lists: the jobs asked for (or the recent submissions), their
views from ONE batched poll, a sweep as one summary (or its tasks one by one).

:func:`collect` gathers; :meth:`Listing.to_json` is what ``status --json`` prints and
:func:`status_json` what the Python API's ``Cluster().status()`` returns on the login
node. ``commands/status.py`` only formats. No torch, no submitit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from hpctrain.jobs import index, poll
from hpctrain.jobs.index import JobEntry
from hpctrain.jobs.poll import Snapshot
from hpctrain.jobs.statedir import task_entry
from hpctrain.jobs.view import JobStatus, fill_progress, job_status, slurm_info

# (index entry, the id as asked for): a job, a sweep task, or one array of a sweep
Target = tuple[JobEntry, str]


@dataclass
class SweepSummary:
    """A sweep as one line: its arrays, its points, how many points are in each state."""

    sweep_id: str
    name: str
    arrays: list[str]
    points: int
    counts: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        """One sweep of ``hpctrain status --json``."""
        return {"job_id": self.sweep_id, "name": self.name, "kind": "sweep",
                "arrays": self.arrays, "points": self.points, "state_counts": self.counts}


Item = Union[JobStatus, SweepSummary]


@dataclass
class Listing:
    """One ``status``: the targets, the poll that answered for them, one item per line."""

    targets: list[Target]
    snapshot: Snapshot
    items: list[Item]

    def to_json(self) -> dict[str, Any]:
        """What ``hpctrain status --json`` prints."""
        snap = self.snapshot
        return {"source": snap.source, "note": snap.note, "slurm_calls": snap.calls,
                "jobs": [item.to_json() for item in self.items]}

    def slurm_word(self) -> tuple[Any, ...]:
        """What Slurm says of each line: a job's state and requeues, a sweep's counts.
        ``status --watch`` polls less often while this stays the same (as ``submit
        --wait`` does); elapsed time and steps change every poll and do not count."""
        return tuple((i.sweep_id, sorted(i.counts.items())) if isinstance(i, SweepSummary)
                     else (i.job_id, i.info.state.name, sum(i.info.requeues.values()))
                     for i in self.items)

    def ended(self) -> bool:
        """Has Slurm finished with every target (``status --watch`` stops then)?"""
        return all(slurm_info(given, rec, self.snapshot).state.final
                   for rec, given in self.targets)


def collect(job_ids: tuple[str, ...] = (), expand: bool = False, limit: int = 20,
            snap: Snapshot | None = None) -> Listing:
    """The listing of ``job_ids`` (a sweep id brings its tasks), or of the ``limit`` most
    recent submissions; sweeps summarised unless ``expand`` or asked for by id. ``snap``:
    Slurm's word from an earlier listing of the same jobs (``status --watch`` between its
    polls: the running jobs' progress is new, Slurm is not asked)."""
    targets = _targets(job_ids, limit)
    asked = set(job_ids)
    if snap is None:
        snap = poll.snapshot([rec.job_id for rec, _ in targets])
    items: list[Item] = []
    for rec, given in targets:
        if rec.kind != "sweep":
            items.append(job_status(given, rec, snap, ask=False))
        elif _first_of_sweep(rec, targets):
            by_task = expand or rec.sweep_id in asked or given in asked
            items += _sweep_items(rec, targets, snap, by_task)
    fill_progress(i for i in items if isinstance(i, JobStatus))   # asked all at once
    return Listing(targets, snap, items)


def status_json(job_ids: tuple[str, ...] = (), expand: bool = False,
                limit: int = 20) -> dict[str, Any]:
    """What ``hpctrain status --json`` prints (the Python API's ``Cluster().status()``)."""
    return collect(job_ids, expand, limit).to_json()


def _targets(job_ids: tuple[str, ...], limit: int) -> list[Target]:
    """(entry, id as given) for the requested jobs, or the recent submissions."""
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


def _members(rec: JobEntry, targets: list[Target]) -> list[JobEntry]:
    return [r for r, _ in targets if r.sweep_id == rec.sweep_id]


def _first_of_sweep(rec: JobEntry, targets: list[Target]) -> bool:
    """A sweep is listed once, at its first array (its siblings fold in)."""
    return rec is _members(rec, targets)[0]


def _sweep_items(rec: JobEntry, targets: list[Target], snap: Snapshot,
                 by_task: bool) -> list[Item]:
    """A sweep as one summary, or one view per task (with the task's point)."""
    members = _members(rec, targets)
    tasks = [(f"{m.job_id}_{t}", m, t) for m in members for t in range(m.num_tasks)]
    if by_task:
        views = []
        for tid, m, t in tasks:
            view = job_status(tid, task_entry(m, t), snap, ask=False)
            view.point = m.points[t] if t < len(m.points) else {}
            views.append(view)
        return list(views)
    counts: dict[str, int] = {}
    for tid, m, _ in tasks:
        state = str(slurm_info(tid, m, snap).state)
        counts[state] = counts.get(state, 0) + 1
    return [SweepSummary(rec.sweep_id, rec.name, [m.job_id for m in members], len(tasks),
                         counts)]
