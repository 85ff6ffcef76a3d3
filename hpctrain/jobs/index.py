"""The job index: what hpctrain submitted from this login node, so ``hpctrain status`` knows
the user's jobs.

One JSON object per line in ``$HPCTRAIN_CACHE_DIR/jobs.jsonl`` (default
``${XDG_CACHE_HOME:-~/.cache}/hpctrain/jobs.jsonl``), appended under an exclusive flock, so
concurrent submits (also from other login nodes sharing the home) never interleave lines.
Lookups do not read that log whole: the newest entries are read backwards from its end,
and a job id or sweep id is found through ``jobs.idx/`` beside it (:mod:`hpctrain.jobs.offsets`:
byte offsets by key, rebuilt from the log whenever they do not match it). The index is a
convenience: Slurm (sacct/squeue) stays the source of truth for states; an entry adds
what Slurm does not know (spec, job folder, log path, checkpoint dir, sweep membership).
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from hpctrain.jobs.offsets import Stale, Store
from hpctrain.jobs.paths import cache_dir

R = TypeVar("R")
Record = dict[str, Any]                 # a log line's fields


@dataclass
class JobEntry:
    """What hpctrain remembers about one submission (a job, or one array of a sweep)."""

    job_id: str                      # Slurm job id (the array job id for a sweep chunk)
    name: str
    kind: str                        # "script" | "function" | "sweep"
    folder: str                      # submitit job folder (submission file, pickles, logs)
    log: str = ""                    # batch log path pattern (%j/%A/%a/%t unexpanded)
    rank_log: str = ""               # per-rank log pattern, when ranks have their own files
    checkpoint_dir: str = ""
    partition: str = ""
    num_tasks: int = 1
    submitted_at: float = field(default_factory=time.time)
    spec: str = ""                   # spec file it came from, if any
    sweep_id: str = ""               # sweep this array belongs to
    sweep_offset: int = 0            # index of this array's task 0 in the whole sweep
    points: list[dict[str, str]] = field(default_factory=list)  # overrides per task (sweeps)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobEntry":
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


# what a line must hold to be an entry (the fields without a default)
REQUIRED = frozenset(f.name for f in fields(JobEntry)
                     if f.default is MISSING and f.default_factory is MISSING)


def index_path() -> Path:
    """The index's log: ``<cache dir>/jobs.jsonl`` (its offsets: ``jobs.idx/`` beside it)."""
    return cache_dir() / "jobs.jsonl"


def append(entries: Iterable[JobEntry]) -> None:
    """Add entries: one locked append of their lines, indexed under the same lock.

    Raises AccessError (naming the path and the fix) when the cache directory, the log or
    its index is not safely the user's own.
    """
    lines = "".join(json.dumps(asdict(e), sort_keys=True) + "\n" for e in entries)
    if lines:
        with Store(index_path(), _parse, create=True) as store:
            store.append(lines.encode())


def recent(limit: int) -> list[JobEntry]:
    """The newest ``limit`` entries, oldest first (read backwards from the log's end)."""
    with Store(index_path(), _parse) as store:
        newest = list(itertools.islice(store.newest(), max(limit, 0)))
    return [JobEntry.from_dict(d) for d in reversed(newest)]


def load(limit: int | None = None) -> list[JobEntry]:
    """Every entry, oldest first; the newest ``limit`` when given (as :func:`recent`).

    Everything means the whole log: no command path asks for that. A damaged line (a
    crash mid-write on another machine's NFS) is skipped, not fatal: the other entries
    stay readable.
    """
    if limit:
        return recent(limit)
    with Store(index_path(), _parse) as store:
        return [JobEntry.from_dict(d) for d in store.values()]


def find(job_id: str) -> JobEntry | None:
    """The entry of a job id, an array task id (``123_4``) or a sweep id: the newest one
    when the id was recorded more than once."""
    base = job_id.split("_")[0]

    def newest(store: Store[Record]) -> JobEntry | None:
        keyed = {off: key for key in {job_id, base} for off in store.offsets(key)}
        for off in sorted(keyed, reverse=True):
            rec = JobEntry.from_dict(store.at(off, keyed[off]))
            if rec.job_id == base or rec.sweep_id == job_id:
                return rec
        return None

    return _query(newest)


def sweep_members(sweep_id: str) -> list[JobEntry]:
    """The arrays of one sweep, in submission order. When the id was used twice (a
    cluster whose job ids started again, as a reinstalled one's do), the newest sweep:
    its arrays are recorded together, starting at offset 0, as :func:`find` takes the
    newest entry of an id."""

    def members(store: Store[Record]) -> list[JobEntry]:
        found = []
        for off in reversed(store.offsets(sweep_id)):
            rec = JobEntry.from_dict(store.at(off, sweep_id))
            if rec.sweep_id == sweep_id:
                found.append(rec)
                if rec.sweep_offset == 0:
                    break                # the newest sweep of this id starts here
        return found[::-1]

    return _query(members)


def _query(ask: Callable[[Store[Record]], R]) -> R:
    """``ask`` the index; when it does not match the log, rebuild it and ask again."""
    with Store(index_path(), _parse) as store:
        try:
            return ask(store)
        except Stale:
            store.rebuild()
            return ask(store)


def _parse(line: bytes) -> tuple[Record, tuple[str, ...]] | None:
    """A log line's fields and keys (job id, sweep id); None for a damaged line. Fields, not
    a JobEntry: indexing the whole log (the migration) needs only the keys."""
    try:
        data = json.loads(line.decode())
    except ValueError:                  # cut short, not JSON, not UTF-8
        return None
    if not isinstance(data, dict) or not REQUIRED <= data.keys():
        return None                     # JSON, but not an entry
    return data, tuple({k for k in (data["job_id"], data.get("sweep_id"))
                        if isinstance(k, str) and k})
