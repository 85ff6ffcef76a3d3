"""Listing, pruning and the ``latest`` pointer of a checkpoint root (no torch).

Shared by :class:`~hpctrain.checkpoint.manager.CheckpointManager` and the
``hpctrain ckpt`` command, which must stay fast on a login node.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpctrain.checkpoint import storage
from hpctrain.checkpoint.manifest import LATEST, step_dirname
from hpctrain.checkpoint.reader import StepReader
from hpctrain.checkpoint.retention import select_deletions
from hpctrain.errors import CheckpointError
from hpctrain.protocol.ckptlayout import latest_text


@dataclass
class StepInfo:
    """One committed step as ``list()`` reports it."""

    step: int
    path: str
    bytes: int
    created: float
    world_size: int
    kind: str
    valid: bool
    problem: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def describe(root: Path, step: int, verify: bool = False) -> StepInfo:
    """Describe one step; ``verify`` reads every byte, otherwise sizes are stat-checked."""
    path = root / step_dirname(step)
    try:
        reader = StepReader(path)
    except CheckpointError as exc:
        return StepInfo(step, str(path), 0, 0.0, 0, "?", False, str(exc))
    problems = reader.verify_files() if verify else [p for p in [reader.check_sizes()] if p]
    man = reader.manifest
    return StepInfo(step, str(path), man.total_bytes, man.created, man.world_size, man.kind,
                    not problems, problems[0] if problems else None)


def list_steps(root: str | os.PathLike[str], verify: bool = False) -> list[StepInfo]:
    """All committed steps under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint root {root} does not exist: pass the directory "
                              "given to CheckpointManager(root=...)")
    return [describe(root, s, verify) for s in storage.committed_steps(root)]


def write_latest(root: Path, step: int, mode: int | None = None) -> None:
    """Atomically point ``root/latest`` at ``step`` (only after its commit is durable)."""
    storage.atomic_write(root / LATEST, latest_text(step).encode(), mode)


def prune(root: Path, keep_last: int, keep_every: int | None = None,
          remove: Callable[[Path], Any] = storage.remove_tree) -> list[int]:
    """Delete old steps crash-safely; the caller holds the root lock. Returns deleted steps.

    Each victim is first renamed to a trash name (atomic, fsynced): a crash leaves a
    complete step or trash, never a half-deleted step that looks committed. ``remove``
    deletes the trash (the manager passes one that runs on a background thread: freeing
    a GB-sized file takes about a second on ext4 here, which a save need not wait for).
    """
    infos = [describe(root, s) for s in storage.committed_steps(root)]
    victims = select_deletions([i.step for i in infos], [i.step for i in infos if i.valid],
                               keep_last, keep_every)
    for step in victims:
        try:
            gone = storage.trash(root, step_dirname(step))
        except OSError as exc:
            raise storage.io_error(f"prune {root / step_dirname(step)}", exc) from None
        storage.fault("prune-after-trash")
        remove(gone)
    return victims


def agreed_steps(comm: Any, root: Path) -> list[int]:
    """The committed steps under ``root`` as rank 0 lists them, on every rank (collective):
    a node with a stale directory cache (NFS, Lustre after a failover) must not pick
    another step."""
    listing: list[int] | None = None
    error: str | None = None
    if comm.rank == 0:
        try:
            listing = storage.committed_steps(root)
        except CheckpointError as exc:
            error = str(exc)
    listing, error = comm.broadcast((listing, error))
    if error:
        raise CheckpointError(error)
    return listing or []
