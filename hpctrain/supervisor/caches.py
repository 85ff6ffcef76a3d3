"""hpctrain's per-job caches, removed when the job ends for good.

Where the container runtime mounts no home, the rendered script sends the scratch a
training stack writes there (Triton's and inductor's compiled kernels, pip's downloads,
``XDG_CACHE_HOME``) to a job-private directory, ``<submit dir>/.hpctrain-cache/<job id>``
(:func:`hpctrain.render.container.container_setup`). A requeued job keeps it (its next run
compiles nothing again); a job that ends for good (completed, failed, cancelled, stopped
at a limit, a requeue that Slurm refused) leaves nothing behind. The user's model caches
(``HF_HOME``, ``TORCH_HOME``) are the user's, never here, never removed.

Only the directory the script made counts: the variable's value must be an absolute path
named by the job under ``.hpctrain-cache/``, so a variable the environment set to
something else (a home directory, say) is never removed.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from hpctrain import protocol as p

# verdict actions after which this job never runs again (requeue and leave: it does)
FINAL = ("finish", "stop", "requeue_failed")


def job_cache(env: Mapping[str, str]) -> Path | None:
    """The job-private cache directory the script made, or None (none made, or the
    variable names anything but ``.hpctrain-cache/<SLURM_JOB_ID>``). Pure."""
    text, job = env.get(p.JOB_CACHE, ""), env.get("SLURM_JOB_ID", "")
    path = Path(text)
    if not text or not job or not path.is_absolute() or ".." in path.parts:
        return None
    if path.name != job or path.parent.name != p.JOB_CACHE_DIR:
        return None
    return path


def drop(env: Mapping[str, str], action: str) -> str | None:
    """Remove the job's cache directory when ``action`` (this run's verdict) ended the job
    for good; a line for the job log, or None when there was nothing to do. The
    ``.hpctrain-cache`` directory goes too once no other job's is left in it."""
    path = job_cache(env)
    if action not in FINAL or path is None or not path.exists():
        return None
    try:
        shutil.rmtree(path)
    except OSError as exc:
        return f"could not remove the job's cache directory {path}: {exc.strerror or exc}"
    try:
        path.parent.rmdir()
    except OSError:    # another job's cache is still there
        pass
    return f"removed the job's cache directory {path} (the job ended: {action})"
