"""A checkpoint manager's snapshots: the state kept in memory, not on storage
(:meth:`CheckpointManager.snapshot <hpctrain.checkpoint.CheckpointManager.snapshot>`), and
restored from there when it can (:meth:`~hpctrain.checkpoint.CheckpointManager.load_latest`).

This process's newest snapshot (:mod:`hpctrain.checkpoint.snapshot`) serves a restart in
the same process; with peer copies (:mod:`hpctrain.checkpoint.peers`) the snapshot also
lies in node memory and at a partner on another node, and serves a restart in new
processes, on a spare node too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.checkpoint import snapshot
from hpctrain.checkpoint.manifest import step_dirname

if TYPE_CHECKING:
    from hpctrain.checkpoint.fit import Fit


class InMemory:
    """One manager's snapshots. Made on every rank at once (collective: with peer copies,
    rank 0 pairs the ranks)."""

    def __init__(self, root: Path, comm: Any) -> None:
        from hpctrain.checkpoint.peers import BUFFERS, PeerCopies
        from hpctrain.checkpoint.writer import Staging

        self.root, self.comm = root, comm
        self.peers = PeerCopies.start(comm)
        # a second set of buffers beside an async save's (a save in flight reads those);
        # with peer copies, two, mapped from node memory: the rank's own copies (the newest,
        # and the newest its partner holds) cost nothing more
        self._plain = Staging()
        peers = self.peers
        self._stagings = [Staging(functools.partial(peers.allocate, i))
                          for i in range(BUFFERS)] if peers is not None else []

    def take(self, step: int, state: dict) -> None:
        """Copy ``state`` into the staging buffers as the newest snapshot, ``step``."""
        from hpctrain.checkpoint.peerwire import NoRoom
        from hpctrain.checkpoint.tree import flatten

        step_dirname(step)
        chunks, extras = flatten(state)
        snapshot.forget(self.root)   # a copy cut short (an exception) must not be restored
        index = None
        if self.peers is not None and not self.peers.off:
            index = self.peers.before_stage()    # a send of that buffer is cut short
            try:
                staged = self._stagings[index].stage(chunks, extras)
            except NoRoom as exc:
                self.peers.turn_off(str(exc))
                index = None
        if index is None:
            staged = self._plain.stage(chunks, extras)
        snapshot.keep(self.root, step, staged)
        if index is not None:            # its checksums and its send: in the background
            self.peers.put(index, step, staged.chunks, staged.extras)  # type: ignore[union-attr]

    def restore(self, state: dict, latest_step: Callable[[], int | None],
                unpickle: str, fit: Fit | None = None) -> tuple[int | None, str]:
        """The step restored from memory on every rank (this process's snapshot, else a peer
        copy), or None (``state`` untouched: storage is read), and the job log's line on
        what did not fit ``state`` ('' when none, or when not rank 0's to say). Rank 0
        alone finds the newest durable step (it stats every rank's files); the rest of the
        agreement is all-reduced: O(1) bytes a rank. All or nothing: every rank checks and
        decodes its snapshot before any writes into its state.

        What does not fit follows a load from storage's rules (:mod:`hpctrain.checkpoint.
        fit`): a refusal (``fit``'s "error") on any rank is a CheckpointError on every rank,
        nothing written. A snapshot laid out otherwise than the state on any rank is not
        restored, and rank 0 says so in the job log (storage, or the peer copies, next)."""
        from hpctrain.checkpoint import fit as fits
        from hpctrain.errors import CheckpointError

        kept = snapshot.newest(self.root)
        mine = kept.step if kept is not None else -1
        high, low = self.comm.all_reduce_max([mine, -mine])   # one step on every rank?
        durable = self.comm.broadcast(latest_step() if self.comm.rank == 0 else None) \
            if high >= 0 or self.peers is not None else None
        whose = self.comm.rank if self.comm.active else None
        if kept is not None and high == -low and (durable is None or high >= durable):
            ready = kept.decode(state)
            outcome: tuple[str, int, str] | None = None
            if isinstance(ready, str):
                outcome = ("layout", self.comm.rank, ready)
            else:
                misfit = fits.in_memory(high, fit, state,
                                        [c.path for c in kept.payload.chunks], ready)
                refused = misfit.refusal()
                outcome = ("error", self.comm.rank, refused) if refused else None
            outcomes = self.comm.outcomes(outcome)
            if not outcomes:
                kept.apply(ready, state)    # type: ignore[arg-type]
                return high, misfit.line(whose)
            refusals = [why for kind, _, why in outcomes if kind == "error"]
            if refusals:                    # the caller's choice: not a step to skip
                raise CheckpointError(refusals[0])
            if self.comm.rank == 0:
                from hpctrain.checkpoint.peerload import from_storage, say

                rank, why = outcomes[0][1:]
                on = "" if whose is None else f" on rank {rank}" + (
                    f" (and {len(outcomes) - 1} other)" if len(outcomes) > 1 else "")
                say(f"not restoring step {high} from memory: its layout differs from the "
                    f"state's{on} ({why}); " + ("trying the peer copies"
                                               if self.peers is not None
                                               else from_storage(durable)))
        if self.peers is not None:
            return self.peers.restore(state, durable, unpickle, fit)
        return None, ""

    def loaded(self, step: int | None, state: dict) -> None:
        """``step`` was loaded into ``state`` (or none): the peer copies of any other step
        go (another past; the training goes on from ``step``), and ``state`` is snapshotted
        at once: a restored step lay whole on one node only (a rank that received its copy
        keeps none, the new pairing's partners none), and a second loss before the next
        snapshot reached its partner would have cost everything since the durable step.
        Collective."""
        if self.peers is not None:
            self.peers.loaded(step)
            if step is not None and not self.peers.off:
                self.take(step, state)

    def close(self) -> None:
        if self.peers is not None:
            self.peers.close()
            self.peers = None
