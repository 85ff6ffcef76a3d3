"""The job index: what hpctrain submitted from this login node, so ``hpctrain status`` knows
the user's jobs.

One JSON object per line in ``$HPCTRAIN_CACHE_DIR/jobs.jsonl`` (default
``${XDG_CACHE_HOME:-~/.cache}/hpctrain/jobs.jsonl``). Appends take an exclusive lock,
so concurrent submits from one login node never interleave lines. The index is a
convenience: Slurm (sacct/squeue) stays the source of truth for states; an entry adds
what Slurm does not know (spec, job folder, log path, checkpoint dir,
sweep membership).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from hpctrain import access
from hpctrain.errors import AccessError
from hpctrain.jobs.paths import ENV_VAR, cache_dir


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
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def index_path() -> Path:
    """The index file: ``<cache dir>/jobs.jsonl``."""
    return cache_dir() / "jobs.jsonl"


def append(entries: Iterable[JobEntry]) -> None:
    """Add entries (one locked append, so concurrent writers never interleave)."""
    lines = "".join(json.dumps(asdict(e), sort_keys=True) + "\n" for e in entries)
    if not lines:
        return
    path = index_path()
    why, fd = access.own_dir(path.parent, 0o700), None
    if why is None:
        try:
            # the record of one's jobs is private; never appended through a planted symlink
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            why = f"{path.name}: {exc.strerror}"
    if fd is None:
        raise AccessError(f"not recording jobs in {path.parent}: {why}. Point "
                          f"{ENV_VAR} at a directory of your own")
    with open(fd, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.write(lines)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load(limit: int | None = None) -> list[JobEntry]:
    """Every entry, oldest first (the newest ``limit`` when given).

    A damaged line (a crash mid-write on another machine's NFS) is skipped, not fatal:
    the other entries stay readable.
    """
    path = index_path()
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(JobEntry.from_dict(json.loads(line)))
        except (ValueError, TypeError):
            continue
    return entries[-limit:] if limit else entries


def find(job_id: str) -> JobEntry | None:
    """The entry of a job id, an array task id (``123_4``) or a sweep id."""
    base = job_id.split("_")[0]
    for rec in reversed(load()):
        if rec.job_id == base or rec.sweep_id == job_id:
            return rec
    return None


def sweep_members(sweep_id: str) -> list[JobEntry]:
    """The arrays of one sweep, in submission order. When the id was used twice (a
    cluster whose job ids started again, as a reinstalled one's do), the newest sweep:
    its arrays are recorded together, starting at offset 0, as :func:`find` takes the
    newest entry of an id."""
    members = [r for r in load() if r.sweep_id == sweep_id]
    starts = [i for i, r in enumerate(members) if r.sweep_offset == 0]
    return members[starts[-1]:] if starts else members
