"""A small local record of what hpctrain submitted, so ``hpctrain status`` knows the user's jobs.

One JSON object per line in ``$HPCTRAIN_CACHE_DIR/jobs.jsonl`` (default
``${XDG_CACHE_HOME:-~/.cache}/hpctrain/jobs.jsonl``). Appends take an exclusive lock,
so concurrent submits from one login node never interleave lines. The record is a
convenience index: Slurm (sacct/squeue) stays the source of truth for states; the
record adds what Slurm does not know (spec, job folder, log path, checkpoint dir,
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

ENV_VAR = "HPCTRAIN_CACHE_DIR"
JOBS_DIR_ENV = "HPCTRAIN_JOBS_DIR"


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


def cache_dir() -> Path:
    """Where the record lives (created on first write)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpctrain"


def jobs_root() -> Path:
    """Where job folders go: ``$HPCTRAIN_JOBS_DIR`` or ``~/hpctrain-jobs``.

    Job folders hold the submission file, pickles and results, so on a real cluster
    this must be storage the compute nodes see (home or a shared scratch).
    """
    return Path(os.environ.get(JOBS_DIR_ENV) or Path.home() / "hpctrain-jobs").expanduser()


def job_folder(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The submitit folder of a job name: ``ROOT/NAME`` (files inside carry the job id).

    No ``%j`` in the folder itself, so it exists before sbatch returns and Slurm can
    open the job's log there however fast the job starts.
    """
    return (Path(root) if root else jobs_root()).expanduser().absolute() / name


def index_path() -> Path:
    return cache_dir() / "jobs.jsonl"


def append(records: Iterable[JobEntry]) -> None:
    """Add records (one locked append, so concurrent writers never interleave)."""
    lines = "".join(json.dumps(asdict(r), sort_keys=True) + "\n" for r in records)
    if not lines:
        return
    path = index_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.write(lines)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load(limit: int | None = None) -> list[JobEntry]:
    """Every record, oldest first (the newest ``limit`` when given).

    A damaged line (a crash mid-write on another machine's NFS) is skipped, not fatal:
    the other records stay readable.
    """
    path = index_path()
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(JobEntry.from_dict(json.loads(line)))
        except (ValueError, TypeError):
            continue
    return records[-limit:] if limit else records


def find(job_id: str) -> JobEntry | None:
    """The record of a job id, an array task id (``123_4``) or a sweep id."""
    base = job_id.split("_")[0]
    for rec in reversed(load()):
        if rec.job_id == base or rec.sweep_id == job_id:
            return rec
    return None


def sweep_members(sweep_id: str) -> list[JobEntry]:
    """The arrays of one sweep, in submission order."""
    return [r for r in load() if r.sweep_id == sweep_id]
