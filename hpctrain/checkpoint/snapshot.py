"""In-memory snapshots: the newest state each rank staged, kept in this process's host memory
so that a restart in the same process (``hpctrain.runtime.run``) restores it without
reading storage.

What a snapshot holds is an async save's staged copy (kept for free: the save made it
anyway) or what :meth:`CheckpointManager.snapshot <hpctrain.checkpoint.CheckpointManager.snapshot>`
copied (host memory only, no disk: cheap enough to take more often than a durable save).
One per checkpoint root, the newest; it outlives the manager that made it, since each
attempt of ``main`` builds its own. A restore is used only when every rank holds the same
step, as new as the newest durable one, laid out as the state asks (else the manager reads
storage, as always).
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

    def decode(self, state: dict) -> dict | None:
        """This snapshot's extras, unpickled, when ``state`` is laid out as the snapshot
        is; else None. Nothing is written (:meth:`apply` does, once every rank agrees)."""
        chunks, _ = flatten(state)
        if [_shape(c) for c in chunks] != [_shape(c) for c in self.payload.chunks]:
            return None
        try:
            return pickle.loads(self.payload.extras)
        except Exception:  # noqa: BLE001 - (this process pickled them: not expected)
            return None

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


_KEPT: dict[Path, Snapshot] = {}   # checkpoint root -> its newest snapshot in this process


def keep(root: Path, step: int, payload: RankPayload) -> None:
    """``payload`` is the newest state of ``root`` in memory (it replaces the last)."""
    _KEPT[root] = Snapshot(step, payload)


def newest(root: Path) -> Snapshot | None:
    return _KEPT.get(root)


def forget(root: Path) -> None:
    _KEPT.pop(root, None)
