"""Where hpctrain keeps a user's files on the login node: its cache directory (the job
index, compiled templates) and the job folders. Cheap to import: every command needs it.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "HPCTRAIN_CACHE_DIR"
JOBS_DIR_ENV = "HPCTRAIN_JOBS_DIR"


def cache_dir() -> Path:
    """``$HPCTRAIN_CACHE_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/hpctrain`` (created on
    first write)."""
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
