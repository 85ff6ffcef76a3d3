"""A checkpoint root's layout on disk, as ``hpctrain.checkpoint`` writes it and as the
login side reads it without torch (``hpctrain.jobs.poll``: a job's last step)::

    <root>/
        step_000001200/     one committed step (step_dirname), its manifest.json inside
        latest              the newest committed step's directory name and a newline

The manifest's own schema stays with the checkpoint package (``checkpoint/manifest.py``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hpctrain.errors import CheckpointError

LATEST = "latest"
STEP_RE = re.compile(r"^step_(\d{9,})$")


def step_dirname(step: int) -> str:
    """``step_000001200``: zero padded so names sort like numbers."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"step={step!r} is not a non-negative int: pass the training step")
    return f"step_{step:09d}"


def parse_step_dirname(name: str) -> int | None:
    """The step of a committed directory name, or None for anything else (tmp, trash)."""
    m = STEP_RE.match(name)
    return int(m.group(1)) if m else None


def latest_text(step: int) -> str:
    """What ``latest`` holds when it points at ``step``."""
    return f"{step_dirname(step)}\n"


def read_latest(root: str | os.PathLike[str]) -> int | None:
    """The step ``<root>/latest`` points at; None when there is none, it cannot be read
    or it does not name a step directory."""
    try:
        text = (Path(root) / LATEST).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return parse_step_dirname(text.strip())
