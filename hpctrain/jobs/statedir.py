"""A job's state directory, seen from the login node: where it is, and its ledger.

The batch step keeps its records under the job's checkpoint dir, else its submit dir
(:mod:`hpctrain.protocol`); the job's index entry says which those are. ``status``, the
job view, ``submit --wait`` and ``report`` all find a job's state directory here, and read
its ledger here. Plain file reads.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain import protocol
from hpctrain.jobs import index
from hpctrain.jobs.index import JobEntry
from hpctrain.jobs.sweep import point_checkpoint_dir
from hpctrain.protocol.ledger import Ledger, entries, read_ledger


def state_dirs(entry: JobEntry) -> tuple[str, str]:
    """Where a job's state directory may be: under its checkpoint dir, else its submit dir."""
    return entry.checkpoint_dir, entry.extra.get("submit_dir", "")


def task_entry(entry: JobEntry, task: int) -> JobEntry:
    """The entry of one task of a sweep array: the array's, with the point's checkpoint dir."""
    return JobEntry(**{**entry.__dict__, "checkpoint_dir": point_checkpoint_dir(entry, task)})


def entry_state_dir(job_id: str, entry: JobEntry) -> Path | None:
    """The state directory of ``job_id`` (of ``entry``); None when the job has none."""
    return protocol.find_state_dir(job_id, *state_dirs(entry))


def entry_of(job_id: str) -> JobEntry | None:
    """The index entry of ``job_id``; for a task of a sweep's array (``123_4``), that task's
    own (its point's checkpoint dir, where its state directory is)."""
    rec = index.find(job_id)
    task = job_id.rsplit("_", 1)[1] if "_" in job_id else ""
    if rec is not None and rec.kind == "sweep" and task.isdigit():
        return task_entry(rec, int(task))
    return rec


def search_bases(job_id: str, base: str = "") -> list[str]:
    """Where ``job_id``'s state directory may be, in order: ``base`` (given by the user),
    then the directories of its index entry ('' for none)."""
    rec = entry_of(job_id)
    return [base, *(state_dirs(rec) if rec is not None else ())]


def lookup(job_id: str, base: str = "") -> Path | None:
    """The state directory of ``job_id``: under ``base``, else where its index entry says;
    None for a job with none (or that this user's index does not know)."""
    return protocol.find_state_dir(job_id, *search_bases(job_id, base))


def ledger(job_id: str, entry: JobEntry) -> Ledger | None:
    """The supervisor's ledger of ``job_id`` (requeues, restarts, exclusions), parsed."""
    return read_ledger(job_id, *state_dirs(entry))


def ledger_lines(state: Path) -> list[tuple[str, dict[str, str]]]:
    """The ledger of the job whose state directory is ``state``, line by line."""
    try:
        return entries((state / protocol.LEDGER).read_text(errors="replace"))
    except OSError:
        return []
