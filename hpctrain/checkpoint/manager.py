"""CheckpointManager: atomic, sharded, async, verified checkpoints under one root.

Commit protocol for step S (see docs/checkpoint.md for what is durable when):

1. rank 0 creates ``root/.tmp-step_S``; every rank writes its shard files there and
   fsyncs each one;
2. rank 0 gathers every rank's file records (this is the barrier), writes
   ``manifest.json`` (fsynced), fsyncs the directory, renames it to ``step_S``
   (the commit), fsyncs the root, then atomically replaces ``latest``;
3. rank 0 prunes old steps (rename to trash, then delete).

A crash at any point leaves either the previous checkpoints untouched plus a ``.tmp-``
or ``.trash-`` directory (cleaned at the next start), or the new step fully committed.
"""

from __future__ import annotations

import atexit
import os
import platform
import sys
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable

from hpctrain.checkpoint import catalog, storage
from hpctrain.checkpoint.hashing import read_manifest
from hpctrain.checkpoint.manifest import MANIFEST, FileRecord, Manifest, step_dirname
from hpctrain.checkpoint.retention import select_deletions
from hpctrain.errors import CheckpointError

WriteFn = Callable[[Path], tuple[list[dict], list[dict], list[dict]]]


class CheckpointManager:
    """Save and restore training state under ``root`` (one directory per step).

    ``keep_last`` newest valid steps are kept plus every step divisible by
    ``keep_every``; ``async_save`` makes :meth:`save` return once the state is copied to
    host staging buffers; ``verify`` checks checksums on load; ``stripe_count`` is passed
    to ``lfs setstripe -c`` on Lustre. Raises CheckpointError at construction when
    ``root`` is missing, not writable, or locked by another job.
    """

    def __init__(self, root: str | os.PathLike[str], keep_last: int = 3,
                 keep_every: int | None = None, async_save: bool = False, *,
                 verify: bool = True, stripe_count: int | None = None) -> None:
        try:
            select_deletions([], [], keep_last, keep_every)  # validates the policy
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        from hpctrain.checkpoint.comm import Comm
        from hpctrain.checkpoint.writer import Background, Staging

        self.root = Path(root).absolute()
        self.keep_last, self.keep_every = keep_last, keep_every
        self.async_save, self.verify, self.stripe_count = async_save, verify, stripe_count
        self.comm = Comm()
        self._lock: storage.RootLock | None = None
        self._setup()
        self._staging = Staging()
        self._bg = Background() if async_save else None
        atexit.register(_flush_at_exit, weakref.ref(self))

    def _setup(self) -> None:
        error = None
        if self.comm.rank == 0:
            try:
                storage.check_root(self.root)
                self._lock = storage.RootLock(self.root)
                storage.clean_leftovers(self.root)
                storage.set_striping(self.root, self.stripe_count)
            except CheckpointError as exc:
                error = str(exc)
        error = self.comm.broadcast(error)
        if error is None and not self.root.is_dir():
            error = (f"checkpoint root {self.root} is not visible on rank {self.comm.rank}: "
                     "use a shared file system every node mounts")
        if error:
            self.close()
            raise CheckpointError(error)

    # -- saving ---------------------------------------------------------------------
    def save(self, step: int, state: dict) -> None:
        """Save ``state`` as ``step`` (collective under torch.distributed).

        Sync: returns when the step is committed and durable. Async: returns once the
        state is copied to staging buffers; a failure surfaces at the next save/wait.
        """
        from hpctrain.checkpoint.tree import flatten
        from hpctrain.checkpoint.writer import assign_owners, payload_direct, write_payload

        step_dirname(step)
        self.wait()  # at most one save in flight; re-raises a background failure
        chunks, extras = flatten(state)
        if self.comm.active:
            owner = assign_owners(self.comm.all_gather([(c.key(), c.nbytes) for c in chunks]))
            chunks = [c for c in chunks if owner[c.key()] == self.comm.rank]
        rank = self.comm.rank
        try:  # a local failure (e.g. an unpicklable extra) must still reach the collectives
            payload = (payload_direct if self._bg is None else self._staging.stage)(chunks, extras)
            write: WriteFn = lambda tmp: write_payload(tmp, rank, payload)  # noqa: E731
        except Exception as exc:  # noqa: BLE001 - re-raised on every rank by _persist
            failure = exc
            write = lambda tmp: _reraise(failure)  # noqa: E731
        if self._bg is None:
            self._persist(step, write, {"kind": "torch"})
        else:
            self._bg.submit(lambda: self._persist(step, write, {"kind": "torch"}))

    def wait(self) -> None:
        """Block until an in-flight async save is durable; raise its failure if it failed."""
        if self._bg is not None:
            self._bg.collect()

    def _persist(self, step: int, write: WriteFn, layout: dict, hash_tree: bool = False) -> None:
        tmp = self.root / f"{storage.TMP_PREFIX}{step_dirname(step)}"
        error = None
        if self.comm.rank == 0:
            try:
                storage.remove_tree(tmp)
                tmp.mkdir()
                storage.set_striping(tmp, self.stripe_count)
            except OSError as exc:
                error = str(storage.io_error(f"create {tmp}", exc))
        error = self.comm.broadcast(error)  # also the barrier before anyone writes
        if error:
            raise CheckpointError(error)
        try:
            storage.fault("before-write")
            result: tuple = ("ok", write(tmp))
        except OSError as exc:
            result = ("error", str(storage.io_error(f"write step {step} in {tmp}", exc)))
        except Exception as exc:  # noqa: BLE001 - must reach rank 0, or the others hang
            result = ("error", f"{type(exc).__name__}: {exc}")
        gathered = self.comm.gather(result)
        if gathered is not None:
            try:
                self._commit(step, tmp, gathered, layout, hash_tree)
            except CheckpointError as exc:
                storage.remove_tree(tmp)
                error = str(exc)
        error = self.comm.broadcast(error)
        if error:
            raise CheckpointError(error)

    def _commit(self, step: int, tmp: Path, gathered: list, layout: dict,
                hash_tree: bool) -> None:
        failed = [msg for status, msg in gathered if status != "ok"]
        if failed:
            prev = self.latest_step()
            kept = (f"the previous checkpoint (step {prev}) is intact" if prev is not None
                    else "no earlier checkpoint exists")
            raise CheckpointError(f"step {step} was not saved: {failed[0]}; {kept}")
        files = [f for _, (fs, _t, _e) in gathered for f in fs]
        if hash_tree:
            from hpctrain.checkpoint.deepspeed_io import hash_files
            files += hash_files(tmp, {f["name"] for f in files})
        manifest = Manifest(
            step=step, world_size=self.comm.world, layout=layout, created=time.time(),
            files=[FileRecord(f["name"], f["size"], [tuple(b) for b in f["blocks"]]) for f in files],
            tensors=[t for _, (_f, ts, _e) in gathered for t in ts],
            extras=[e for _, (_f, _t, es) in gathered for e in es],
            versions=_versions())
        final = self.root / step_dirname(step)
        try:
            storage.atomic_write(tmp / MANIFEST, manifest.dumps())
            storage.fault("before-dir-fsync")
            storage.fsync_path(tmp)
            storage.fault("before-rename")
            if final.exists():  # re-saving a step (e.g. right after a resume)
                storage.remove_tree(storage.trash(self.root, final.name))
            os.rename(tmp, final)  # the commit
            storage.fault("after-rename")
            storage.fsync_path(self.root)
            storage.fault("before-latest")
            catalog.write_latest(self.root, step)
            storage.fault("after-latest")
        except OSError as exc:
            raise storage.io_error(f"commit step {step} in {self.root}", exc) from None
        catalog.prune(self.root, self.keep_last, self.keep_every)

    # -- loading --------------------------------------------------------------------
    def latest_step(self) -> int | None:
        """Newest committed step whose files are all present at full size, or None."""
        for step in reversed(storage.committed_steps(self.root)):
            if catalog.describe(self.root, step).valid:
                return step
        return None

    def load_latest(self, state: dict, verify: bool | None = None) -> int | None:
        """Load the newest step that verifies into ``state`` in place; return it (or None).

        A step that fails verification is skipped with a warning and the previous one
        is tried. Collective under torch.distributed (all ranks agree on the step).
        """
        from hpctrain.checkpoint.loader import CorruptCheckpoint

        self.wait()
        for step in reversed(storage.committed_steps(self.root)):
            outcome: tuple[str, str] | None = None
            try:
                self._load(step, state, verify)
            except CorruptCheckpoint as exc:
                outcome = ("corrupt", str(exc))
            except CheckpointError as exc:  # the caller's mistake: raise it on every rank
                outcome = ("error", str(exc))
            outcomes = [o for o in self.comm.all_gather(outcome) if o]
            if not outcomes:
                return step
            errors = [msg for kind, msg in outcomes if kind == "error"]
            if errors:
                raise CheckpointError(errors[0])
            warnings.warn(f"hpctrain: skipping checkpoint step {step}: {outcomes[0][1]}",
                          RuntimeWarning, stacklevel=2)
        return None

    def load(self, step: int, state: dict, verify: bool | None = None) -> None:
        """Load ``step`` into ``state`` in place; CheckpointError if absent or damaged."""
        self.wait()
        self._load(step, state, verify)

    def _load(self, step: int, state: dict, verify: bool | None) -> None:
        from hpctrain.checkpoint.loader import CorruptCheckpoint, load_step

        path = self.root / step_dirname(step)
        if not path.is_dir():
            raise CheckpointError(f"no checkpoint for step {step} in {self.root}: "
                                  f"choose one of {storage.committed_steps(self.root)}")
        try:
            manifest = read_manifest(path)
        except CheckpointError as exc:
            raise CorruptCheckpoint(str(exc)) from None
        if manifest.layout.get("kind") != "torch":
            raise CheckpointError(f"step {step} is a {manifest.layout.get('kind')} checkpoint: "
                                  "load it with hpctrain.checkpoint.load_deepspeed")
        load_step(path, manifest, state, self.comm.rank,
                  self.verify if verify is None else verify)

    def list(self, verify: bool = False) -> list[catalog.StepInfo]:
        """Committed steps, oldest first, with size, time and validity."""
        return catalog.list_steps(self.root, verify)

    def close(self) -> None:
        """Flush an in-flight save and release the root lock."""
        try:
            if getattr(self, "_bg", None) is not None:
                self._bg.collect()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _reraise(exc: Exception) -> Any:
    raise exc


def _versions() -> dict[str, str]:
    import torch

    import hpctrain

    return {"hpctrain": hpctrain.__version__, "torch": torch.__version__,
            "python": platform.python_version()}


def _flush_at_exit(ref: weakref.ref) -> None:
    """Interpreter exit: finish the in-flight save; a failure is printed, not lost."""
    mgr = ref()
    if mgr is None:
        return
    try:
        mgr.close()
    except Exception as exc:  # noqa: BLE001 - nothing left to raise into at exit
        print(f"hpctrain: checkpoint save failed at exit: {exc}", file=sys.stderr)
