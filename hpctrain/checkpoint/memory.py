"""A checkpoint manager's snapshots: the state kept in memory, not on storage
(:meth:`CheckpointManager.snapshot <hpctrain.checkpoint.CheckpointManager.snapshot>`), and
restored from there when it can (:meth:`~hpctrain.checkpoint.CheckpointManager.load_latest`).

This process's newest snapshot (:mod:`hpctrain.checkpoint.snapshot`) serves a restart in
the same process; with peer copies (:mod:`hpctrain.checkpoint.peers`) the snapshot also
lies in node memory and at a partner on another node, and serves a restart in new
processes, on a spare node too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.checkpoint import snapshot
from hpctrain.checkpoint.manifest import step_dirname


class InMemory:
    """One manager's snapshots. Made on every rank at once (collective: with peer copies,
    rank 0 pairs the ranks)."""

    def __init__(self, root: Path, comm: Any) -> None:
        from hpctrain.checkpoint.peers import PeerCopies
        from hpctrain.checkpoint.writer import Staging

        self.root, self.comm = root, comm
        self.peers = PeerCopies.start(comm)
        # a second set of buffers beside an async save's (a save in flight reads those);
        # with peer copies, mapped from node memory: the rank's own copy costs nothing more
        self._staging = Staging(self.peers.allocate if self.peers else None)

    def take(self, step: int, state: dict) -> None:
        """Copy ``state`` into the staging buffers as the newest snapshot, ``step``."""
        from hpctrain.checkpoint.tree import flatten

        step_dirname(step)
        chunks, extras = flatten(state)
        snapshot.forget(self.root)   # a copy cut short (an exception) must not be restored
        if self.peers is not None:
            self.peers.before_stage()    # the last copy's send reads the staging memory
        staged = self._staging.stage(chunks, extras)
        snapshot.keep(self.root, step, staged)
        if self.peers is not None:       # its checksums and its send: in the background
            self.peers.put(step, staged.chunks, staged.extras)

    def restore(self, state: dict, latest_step: Callable[[], int | None],
                unpickle: str) -> int | None:
        """The step restored from memory on every rank (this process's snapshot, else a peer
        copy), or None (nothing restored that the caller keeps: storage is read). Rank 0
        alone finds the newest durable step (it stats every rank's files); the rest of the
        agreement is all-reduced: O(1) bytes a rank."""
        kept = snapshot.newest(self.root)
        mine = kept.step if kept is not None else -1
        high, low = self.comm.all_reduce_max([mine, -mine])   # one step on every rank?
        durable = self.comm.broadcast(latest_step() if self.comm.rank == 0 else None) \
            if high >= 0 or self.peers is not None else None
        step = None
        if kept is not None and high == -low and (durable is None or high >= durable):
            laid_out_otherwise = self.comm.all_reduce_max([0 if kept.restore(state) else 1])
            step = None if laid_out_otherwise[0] else high   # (on any rank: none restores)
        if step is None and self.peers is not None:
            step = self.peers.restore(state, durable, unpickle)
        return step

    def loaded(self, step: int | None) -> None:
        """``step`` was loaded (or none): the peer copies of any other step go (another
        past; the training goes on from ``step``)."""
        if self.peers is not None:
            self.peers.forget_others(step)

    def close(self) -> None:
        if self.peers is not None:
            self.peers.close()
            self.peers = None
