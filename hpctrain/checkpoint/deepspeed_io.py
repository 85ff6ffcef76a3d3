"""DeepSpeed engines through the same commit protocol.

DeepSpeed's own ``save_checkpoint`` writes ``latest`` without fsync or rename, so a
crash can leave it pointing at a partial tag. Here the engine writes its files into
the manager's temporary step directory (``save_latest=False``); every rank fsyncs them,
rank 0 checksums them into the manifest and commits exactly like a torch step.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from hpctrain.checkpoint import checksum, storage
from hpctrain.checkpoint.hashing import read_manifest, verify_step
from hpctrain.checkpoint.manifest import MANIFEST, step_dirname
from hpctrain.errors import CheckpointError
from hpctrain.runtime import progress

TAG = "ds"
BLOCK = 64 << 20  # one checksum per 64 MiB: a damaged byte is located to within a block


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (DeepSpeed does not)."""
    for p in _files(root):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in sorted({p.parent for p in _files(root)} | {root}, key=lambda p: -len(p.parts)):
        storage.fsync_path(d)


def hash_files(root: Path, exclude: set[str], algorithm: str = checksum.DEFAULT) -> list[dict]:
    """File records (size, a checksum per 64 MiB block) of every file under ``root``."""
    fn, out = checksum.get(algorithm), []
    for p in _files(root):
        name = p.relative_to(root).as_posix()
        if name in exclude or name == MANIFEST:
            continue
        blocks, off = [], 0
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(BLOCK):
                blocks.append([off, len(chunk), fn(chunk)])
                off += len(chunk)
        out.append({"name": name, "size": off, "blocks": blocks, "checksum": algorithm})
    return out


def save_deepspeed(manager: Any, step: int, engine: Any,
                   client_state: dict | None = None) -> None:
    """``engine.save_checkpoint`` as step ``step`` of ``manager`` (collective, synchronous)."""
    manager.wait()

    def write(tmp: Path) -> tuple[list, list, list]:
        engine.save_checkpoint(str(tmp), tag=TAG, client_state=client_state or {},
                               save_latest=False)
        fsync_tree(tmp)  # each rank flushes what it wrote (Lustre: per-client dirty pages)
        return [], [], []

    with progress.phase("saving"):
        manager._persist(step, write, {"kind": "deepspeed", "tag": TAG}, hash_tree=True)


def load_deepspeed(manager: Any, engine: Any, step: int | None = None,
                   verify: bool | None = None, **load_kwargs: Any) -> tuple[int | None, dict]:
    """Load the newest verified (or the given) DeepSpeed step into ``engine``.

    Returns (step, client_state); (None, {}) when the root holds no DeepSpeed step.
    Damaged steps are skipped with a warning, as in ``load_latest``.
    """
    manager.wait()
    manager.check_trusted()  # DeepSpeed's files are pickles
    verify = manager.verify if verify is None else verify
    root = manager.root
    candidates = [step] if step is not None else list(reversed(manager.agreed_steps()))
    for s in candidates:
        path = root / step_dirname(s)
        problem = None
        if manager.comm.rank == 0:
            problem = _check(path, verify)
        problem = manager.comm.broadcast(problem)
        if problem is None:
            _, client_state = engine.load_checkpoint(str(path), tag=TAG, **load_kwargs)
            return s, client_state or {}
        if step is not None:
            raise CheckpointError(problem)
        warnings.warn(f"hpctrain: skipping checkpoint step {s}: {problem}", RuntimeWarning,
                      stacklevel=2)
    return None, {}


def _check(path: Path, verify: bool) -> str | None:
    try:
        manifest = read_manifest(path)
    except CheckpointError as exc:
        return str(exc)
    if manifest.layout.get("kind") != "deepspeed":
        return f"{path} is a {manifest.layout.get('kind')} checkpoint, not a DeepSpeed one"
    problems = verify_step(path) if verify else []
    return problems[0] if problems else None
