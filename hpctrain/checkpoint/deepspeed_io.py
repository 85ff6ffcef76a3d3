"""DeepSpeed engines through the same commit protocol.

DeepSpeed's own ``save_checkpoint`` writes ``latest`` without fsync or rename, so a
crash can leave it pointing at a partial tag. Here the engine writes its files into
the manager's temporary step directory (``save_latest=False``) through
:meth:`CheckpointManager.save_files`: every rank fsyncs them, rank 0 checksums them into
the manifest and commits exactly like a torch step. Loading skips damaged steps as
``load_latest`` does (:meth:`CheckpointManager.first_loadable`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.checkpoint.manifest import step_dirname
from hpctrain.checkpoint.reader import StepReader
from hpctrain.errors import CheckpointCorrupt, CheckpointError
from hpctrain.runtime import progress

TAG = "ds"


def save_deepspeed(manager: Any, step: int, engine: Any,
                   client_state: dict | None = None) -> None:
    """``engine.save_checkpoint`` as step ``step`` of ``manager`` (collective, synchronous)."""

    def write(tmp: Path) -> None:
        engine.save_checkpoint(str(tmp), tag=TAG, client_state=client_state or {},
                               save_latest=False)

    manager.save_files(step, write, {"kind": "deepspeed", "tag": TAG})


def load_deepspeed(manager: Any, engine: Any, step: int | None = None,
                   verify: bool | None = None, **load_kwargs: Any) -> tuple[int | None, dict]:
    """Load the newest verified (or the given) DeepSpeed step into ``engine``.

    Returns (step, client_state); (None, {}) when the root holds no DeepSpeed step.
    Damaged steps are skipped with a warning, as in ``load_latest``.
    """
    manager.wait()
    manager.check_trusted()  # DeepSpeed's files are pickles
    verify = manager.verify if verify is None else verify

    def check(s: int) -> None:  # rank 0 reads and verifies; first_loadable tells every rank
        problem = _check(manager.root / step_dirname(s), verify) if manager.comm.rank == 0 \
            else None
        if problem is not None:
            raise CheckpointCorrupt(problem)

    found = manager.first_loadable(check, step)
    progress.resumed(found)   # where the steps count from, for a crash's position
    if found is None:
        return None, {}
    _, client_state = engine.load_checkpoint(str(manager.root / step_dirname(found)), tag=TAG,
                                             **load_kwargs)
    return found, client_state or {}


def _check(path: Path, verify: bool) -> str | None:
    try:
        reader = StepReader(path)
        if reader.manifest.kind != "deepspeed":
            return f"{path} is a {reader.manifest.kind} checkpoint, not a DeepSpeed one"
        problems = reader.verify_files() if verify else []
    except CheckpointError as exc:
        return str(exc)
    return problems[0] if problems else None
