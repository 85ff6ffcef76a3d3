"""What can be checked on the login node before a job waits in the queue, so that it does
not fail at its start hours later: the checkpoint directory can be made and written (as
far as this node sees the storage), and the ``[sbatch]`` options do not undo what the spec
asks for. ``submit``, ``sweep`` and ``submit --dry-run`` run it; each error names the value
and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.errors import SpecError
from hpctrain.spec.model import JobSpec


def precheck(spec: JobSpec) -> None:
    """Raise :class:`SpecError` for what would fail the job at its start."""
    if spec.checkpoint.dir:
        checkpoint_dir(spec.checkpoint.dir)
    export_keeps_passthrough(spec)


def checkpoint_dir(path: str) -> None:
    """The checkpoint directory, or its nearest existing parent, is a directory this user
    may write. A path of which nothing exists here (storage only the compute nodes mount)
    cannot be judged from the login node and passes."""
    p = Path(path)
    existing = next((q for q in (p, *p.parents) if q.exists()), None)
    if existing is None or existing == Path(existing.anchor):
        return
    if not existing.is_dir():
        where = "is a file" if existing == p else f"lies below the file {str(existing)!r}"
        raise SpecError(f"checkpoint.dir={path!r} {where}: point it at a directory (or a "
                        "path that does not exist yet) on storage every node sees")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is" if existing == p else f"would be made in {str(existing)!r}, which is"
        raise SpecError(f"checkpoint.dir={path!r} {what} not writable by you: choose a "
                        "directory of your own (e.g. under your scratch or home)")


def export_keeps_passthrough(spec: JobSpec) -> None:
    """``[sbatch] export`` that keeps this environment from the job (NONE, or a list
    without them) would drop ``run.env_passthrough``'s variables on the way."""
    export = spec.sbatch.get("export")
    names = spec.run.env_passthrough
    if export is None or not names:
        return
    given = {item.split("=", 1)[0] for item in str(export).split(",")}
    if "ALL" in given:
        return
    missing = [n for n in names if n not in given]
    if missing:
        raise SpecError(f"[sbatch] export={export!r} keeps {', '.join(missing)} "
                        "(run.env_passthrough) from reaching the job: drop the export option, "
                        "or name them in it beside what else the job needs")
