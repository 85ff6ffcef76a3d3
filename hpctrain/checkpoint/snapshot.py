"""In-memory snapshots: the newest state each rank staged, kept in this process's host memory
so that a restart in the same process (``hpctrain.runtime.run``) restores it without
reading storage.

What a snapshot holds is an async save's staged copy (kept for free: the save made it
anyway) or what :meth:`CheckpointManager.snapshot <hpctrain.checkpoint.CheckpointManager.snapshot>`
copied (host memory only, no disk: cheap enough to take more often than a durable save).
One per checkpoint root, the newest; it outlives the manager that made it, since each
attempt of ``main`` builds its own. A restore is used only when every rank holds the same
step, as new as the newest durable one, laid out as the state asks (else the manager reads
storage, the one copy every rank can reach).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.checkpoint.tree import Chunk, flatten, set_path

if TYPE_CHECKING:
    from hpctrain.checkpoint.writer import RankPayload


@dataclass(frozen=True)
class Snapshot:
    """One rank's state at ``step``, in host memory."""

    step: int
    payload: RankPayload

    def decode(self, state: dict) -> dict | str:
        """This snapshot's extras, unpickled, when ``state`` is laid out as the snapshot
        is; else why not (for the job log). Nothing is written (:meth:`apply` does, once
        every rank agrees)."""
        chunks, _ = flatten(state)
        if [_shape(c) for c in chunks] != [_shape(c) for c in self.payload.chunks]:
            return differs(chunks, self.payload.chunks)
        try:
            return pickle.loads(self.payload.extras)
        except Exception as exc:  # noqa: BLE001 - (this process pickled them: not expected)
            return f"its extras do not unpickle ({type(exc).__name__}: {exc})"[:300]

    def apply(self, extras: dict, state: dict) -> None:
        """Copy this snapshot into ``state``'s tensors in place and set its ``extras``
        (outside autograd: a parameter that requires grad is written like any tensor)."""
        import torch

        chunks, _ = flatten(state)
        with torch.no_grad():
            for mine, kept in zip(chunks, self.payload.chunks):
                if mine.nbytes:
                    mine.local.copy_(kept.local.view(mine.dtype).view(mine.shape))
        for path, value in extras.items():
            set_path(state, path, value)


def _shape(c: Chunk) -> tuple:
    return (c.path, c.offsets, c.shape, c.dtype, c.global_shape)


def differs(state: list[Chunk], kept: list[Chunk]) -> str:
    """How the state's tensors (``state``: its chunks) differ from a snapshot's (``kept``),
    in a few words: ``model.l1 in the snapshot, not in the state``."""
    from hpctrain.checkpoint.fit import names

    mine, theirs = {c.path for c in state}, {c.path for c in kept}
    parts = []
    if theirs - mine:
        parts.append(f"{names(sorted(theirs - mine, key=repr))} in the snapshot, not in "
                     "the state")
    if mine - theirs:
        parts.append(f"{names(sorted(mine - theirs, key=repr))} in the state, not in "
                     "the snapshot")
    if not parts:
        at = {c.path: c for c in kept}
        other = [c for c in state if _shape(at[c.path]) != _shape(c)]
        if other:
            c, k = other[0], at[other[0].path]
            parts.append(f"{names([c.path])}: {_said(c)} in the state, {_said(k)} in the "
                         "snapshot" + (f", and {len(other) - 1} more" if len(other) > 1 else ""))
        else:
            parts.append("the tensors in another order")
    return "; ".join(parts)


def _said(c: Chunk) -> str:
    """``float32 [4, 3]`` (``at [2, 0] of [8, 3]`` for a shard)."""
    what = f"{str(c.dtype).removeprefix('torch.')} {list(c.shape)}"
    if tuple(c.shape) != tuple(c.global_shape) or any(c.offsets):
        what += f" at {list(c.offsets)} of {list(c.global_shape)}"
    return what


_KEPT: dict[Path, Snapshot] = {}   # checkpoint root -> its newest snapshot in this process


def keep(root: Path, step: int, payload: RankPayload) -> None:
    """``payload`` is the newest state of ``root`` in memory (it replaces the last)."""
    _KEPT[root] = Snapshot(step, payload)


def newest(root: Path) -> Snapshot | None:
    return _KEPT.get(root)


def forget(root: Path) -> None:
    _KEPT.pop(root, None)
