"""CheckpointManager: atomic, sharded, async, verified checkpoints under one root.

Commit protocol for step S (see docs/checkpoint.md for what is durable when):

1. rank 0 creates ``root/.tmp-step_S``; every rank writes its shard files there and
   fsyncs each one;
2. rank 0 gathers every rank's records (:class:`~hpctrain.checkpoint.manifest.RankRecords`;
   this is the barrier), writes ``manifest.json`` (fsynced), fsyncs the directory,
   renames it to ``step_S`` (the commit), fsyncs the root, then atomically replaces
   ``latest`` (:mod:`hpctrain.checkpoint.commit`);
3. rank 0 prunes old steps (rename to trash, then delete).

Re-saving a step that exists moves the old directory aside (``.old-step_S.*``) before the
rename and deletes it after; a crash between the two puts it back at the next start.
A crash at any point leaves either the previous checkpoints untouched plus a ``.tmp-``,
``.old-`` or ``.trash-`` directory (handled at the next start), or the new step fully
committed.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable

from hpctrain import access as access_levels
from hpctrain import protocol
from hpctrain.checkpoint import catalog, commit, open_managers, settings, snapshot, storage
from hpctrain.checkpoint.hashing import hash_files
from hpctrain.checkpoint.manifest import RankRecords, step_dirname
from hpctrain.checkpoint.memory import InMemory
from hpctrain.checkpoint.reader import read_rank_view
from hpctrain.checkpoint.retention import select_deletions
from hpctrain.errors import CheckpointCorrupt, CheckpointError
from hpctrain.runtime import progress

WriteFn = Callable[[Path], RankRecords]   # one rank's part of a save, into the temp dir


class CheckpointManager:
    """Save and restore training state under ``root`` (one directory per step).

    ``keep_last`` newest valid steps are kept plus every step divisible by
    ``keep_every``; ``async_save`` makes :meth:`save` return once the state is copied to
    host staging buffers; ``verify`` checks checksums on load; ``stripe_count`` is passed
    to ``lfs setstripe -c`` on Lustre; :meth:`due` says a step is due every
    ``interval_steps``. In an hpctrain job, what is not given comes from the spec's
    ``[checkpoint]`` table (``CheckpointManager()`` alone: its dir, keep_last, keep_every,
    stripe_count, interval_steps; :mod:`hpctrain.checkpoint.settings`); outside one, a
    manager without ``root`` is refused. Raises CheckpointError at construction when
    ``root`` is missing or not writable, and StorageUnavailable when another job still
    holds its lock after ``lock_wait_s`` (default 120 s: a lock of a dead node's job
    lingers until the file system gives up on that node).

    ``access`` ("private": steps 0700, files 0600; "group": 0750/0640; default
    ``$HPCTRAIN_CKPT_ACCESS`` else "private") sets who may read the checkpoints, whatever
    the umask. A root another user owns, or one every user may write (without the sticky
    bit), is refused at construction (anyone could plant steps there, and loading
    unpickles the extras) unless ``trust=True``; extras load through a restricted
    unpickler either way unless ``unpickle="any"`` (see :mod:`hpctrain.checkpoint.unpickle`).
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, keep_last: int | None = None,
                 keep_every: int | None = None, async_save: bool = False, *,
                 verify: bool = True, stripe_count: int | None = None,
                 lock_wait_s: float | None = None, trust: bool = False,
                 access: str | None = None, unpickle: str = "safe",
                 interval_steps: int | None = None) -> None:
        given = settings.resolve(root, keep_last=keep_last, keep_every=keep_every,
                                 stripe_count=stripe_count, interval_steps=interval_steps)
        root, keep_last, keep_every = given.root, given.keep_last, given.keep_every
        stripe_count, self.interval_steps = given.stripe_count, given.interval_steps
        try:
            select_deletions([], [], keep_last, keep_every)  # validates the policy
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        from hpctrain.checkpoint.comm import Comm
        from hpctrain.checkpoint.saveplan import PlanCache
        from hpctrain.checkpoint.writer import Background, Staging

        self.root = Path(root).absolute()
        self.keep_last, self.keep_every = keep_last, keep_every
        self.async_save, self.verify, self.stripe_count = async_save, verify, stripe_count
        self.lock_wait_s = storage.LOCK_WAIT_S if lock_wait_s is None else lock_wait_s
        self.trust = trust
        try:
            self.modes = access_levels.modes(access or os.environ.get(protocol.CKPT_ACCESS)
                                             or "private")
        except ValueError as exc:
            raise CheckpointError(f"{exc} (CheckpointManager(access=...) or "
                                  f"${protocol.CKPT_ACCESS})") from None
        if unpickle not in ("safe", "any"):
            raise CheckpointError(f"unpickle={unpickle!r}: use \"safe\" (builtins, numpy and "
                                  "torch types only) or \"any\" (extras you wrote yourself)")
        self.unpickle = unpickle
        self.comm = Comm()
        self.plans = PlanCache()   # the save plan, reused while the state's structure stays
        self._lock: storage.RootLock | None = None
        self._memory: InMemory | None = None
        self._setup()
        self._memory = InMemory(self.root, self.comm)   # snapshot()'s (and peer copies)
        self._staging = Staging()
        self._bg = Background() if async_save else None
        self._removals: list[storage.Task] = []  # pruned steps being deleted
        open_managers.register(self)

    def _setup(self) -> None:
        error: CheckpointError | None = None
        if self.comm.rank == 0:
            try:
                if self.root.exists():  # judged before anything is written there
                    self.check_trusted()
                storage.check_root(self.root)
                self._lock = storage.RootLock(self.root, self.lock_wait_s)
                storage.clean_leftovers(self.root)
                storage.set_striping(self.root, self.stripe_count)
            except CheckpointError as exc:
                error = exc
        # the error's class too: StorageUnavailable must stay requeue-able on every rank
        shared = self.comm.broadcast(None if error is None else (type(error), str(error)))
        if shared is not None:
            kind, message = shared
            error = kind(message)
        if error is None and not self.root.is_dir():
            error = CheckpointError(f"checkpoint root {self.root} is not visible on rank "
                                    f"{self.comm.rank}: use a shared file system every node mounts")
        if error is not None:
            self.close()
            raise error

    # -- saving ---------------------------------------------------------------------
    def save(self, step: int, state: dict) -> None:
        """Save ``state`` as ``step`` (collective under torch.distributed).

        Sync: returns when the step is committed and durable. Async: returns once the
        state is copied to staging buffers; a failure surfaces at the next save/wait.
        The hang watchdog gives the blocking part its save timeout.
        """
        with progress.phase("saving"):
            self._save(step, state)

    def _save(self, step: int, state: dict) -> None:
        from hpctrain.checkpoint.tree import flatten
        from hpctrain.checkpoint.writer import extras_fingerprints, rank_writer

        step_dirname(step)
        self.wait()  # at most one save in flight; re-raises a background failure
        chunks, extras = flatten(state)
        if self._bg is None:
            self._persist(step, rank_writer(self.comm, self.plans, chunks, extras),
                          self._layout())
            return
        # async: the caller waits only for the copy into staging (and the extras' pickles);
        # who writes what (a checksum of every plain tensor, then a collective) is decided
        # in the background, from the staged copy
        snapshot.forget(self.root)   # its buffers may be the ones about to be overwritten
        try:
            staged = self._staging.stage(chunks, extras)
            fps = extras_fingerprints(extras) if self.comm.active else {}
        except Exception as exc:  # noqa: BLE001 - reaches every rank through the collectives
            staged, fps, failure = None, {}, exc
        else:
            failure = None
            snapshot.keep(self.root, step, staged)   # the staged copy: a snapshot for free
        self._bg.submit(lambda: self._persist(
            step, rank_writer(self.comm, self.plans, staged.chunks if staged else [], {},
                              staged, fps, failure),
            self._layout()))

    def _layout(self) -> dict:
        """What a durable step records of how it was saved: a torch state, and the step's
        tp x dp x pp layout (a load at another data-parallel width maps its ranks)."""
        from hpctrain.checkpoint.remap import mesh_of

        return {"kind": "torch", **mesh_of(self.comm.world)}

    def due(self, step: int) -> bool:
        """Is a save due after ``step`` steps (every ``interval_steps``, the spec's
        ``[checkpoint] interval_steps`` in a job)?"""
        return step > 0 and step % self.interval_steps == 0

    def save_if_due(self, step: int, state: dict) -> bool:
        """:meth:`save` ``state`` as ``step`` when :meth:`due`; whether it saved.
        Collective like :meth:`save`: every rank calls it with the same ``step``."""
        if not self.due(step):
            return False
        self.save(step, state)
        return True

    def wait(self) -> None:
        """Block until an in-flight async save is durable; raise its failure if it failed."""
        if self._bg is not None:
            with progress.phase("saving"):
                self._bg.collect()

    def save_files(self, step: int, write: Callable[[Path], Any], layout: dict) -> None:
        """Commit as ``step`` the files ``write(dir)`` puts into the step's temporary
        directory, for code that writes its own checkpoint files (DeepSpeed's engine).

        Collective and synchronous, like a sync :meth:`save`: every rank calls it, and its
        ``write`` once the directory exists; every rank then fsyncs the files there, rank 0
        checksums them into the manifest (``layout``: ``{"kind": ...}``, what wrote them)
        and commits the step. ``write``'s exception fails the save on every rank.
        """
        def rank_write(tmp: Path) -> RankRecords:
            write(tmp)
            storage.fsync_tree(tmp)  # each rank flushes its writes (Lustre: per-client pages)
            return RankRecords()

        self.wait()
        with progress.phase("saving"):
            self._persist(step, rank_write, layout, foreign=True)

    def _persist(self, step: int, write: WriteFn, layout: dict, foreign: bool = False) -> None:
        """The commit protocol (the module's docstring) around every rank's ``write``;
        ``foreign``: rank 0 checksums the files no rank recorded (:meth:`save_files`)."""
        tmp = self.root / f"{storage.TMP_PREFIX}{step_dirname(step)}"
        error = None
        if self.comm.rank == 0:
            try:
                storage.remove_tree(tmp)
                tmp.mkdir(self.modes.dir)  # private from the first byte, not after the commit
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
                self._commit(step, tmp, gathered, layout, foreign)
            except (CheckpointError, OSError) as exc:
                # an OSError too (rank 0 reading foreign files back): every rank must hear
                # of it in the broadcast below, or the others wait there forever
                storage.remove_tree(tmp)
                error = str(exc if isinstance(exc, CheckpointError)
                            else storage.io_error(f"commit step {step} in {tmp}", exc))
        error = self.comm.broadcast(error)
        if error:
            raise CheckpointError(error)

    def _commit(self, step: int, tmp: Path, gathered: list, layout: dict,
                foreign: bool) -> None:
        failed = [msg for status, msg in gathered if status != "ok"]
        if failed:
            prev = self.latest_step()
            kept = (f"the previous checkpoint (step {prev}) is intact" if prev is not None
                    else "no earlier checkpoint exists")
            raise CheckpointError(f"step {step} was not saved: {failed[0]}; {kept}")
        records: list[RankRecords] = [r for _, r in gathered]
        summed = hash_files(tmp, {f.name for r in records for f in r.files}) if foreign \
            else None
        manifest = commit.manifest_of(step, self.comm.world, layout, records, summed)
        commit.publish(self.root, tmp, manifest, self.modes.dir, self.modes.file)
        catalog.prune(self.root, self.keep_last, self.keep_every, remove=self._remove_later)

    def _remove_later(self, trash: Path) -> None:
        """Delete a pruned step's trash on a background thread (close() waits for it;
        one cut short by a crash is deleted at the next start, as any trash is)."""
        self._removals = [t for t in self._removals if not t.done()]
        self._removals.append(storage.Task(storage.remove_tree, trash,
                                           name="hpctrain-ckpt-prune"))

    # -- loading --------------------------------------------------------------------
    def latest_step(self) -> int | None:
        """Newest committed step whose files are all present at full size, or None."""
        for step in reversed(storage.committed_steps(self.root)):
            if catalog.describe(self.root, step).valid:
                return step
        return None

    def snapshot(self, step: int, state: dict) -> None:
        """Keep ``state`` as ``step`` in this process's host memory, not on storage: a
        restart in the same process (``hpctrain.runtime.run``) resumes from it. Call it on
        every rank at the same step, as :meth:`save`; it costs one copy of the state into
        buffers allocated once (a second set beside an async save's), no I/O and no
        collective. An async save keeps its staged copy as a snapshot too. With peer copies
        (``[elastic] peer_copies``) it also lies in node memory and at a partner rank on
        another node (:mod:`hpctrain.checkpoint.peers`)."""
        assert self._memory is not None, "snapshot() on a closed CheckpointManager"
        self._memory.take(step, state)

    def load_latest(self, state: dict, verify: bool | None = None, *,
                    on_unexpected: str = "warn", on_missing: str = "warn") -> int | None:
        """Load the newest step into ``state`` in place; return it (or None).

        From this process's memory when every rank holds a snapshot of the same step, as
        new as the newest durable one (a restart in the same process: no storage read);
        else, with peer copies, from node memory (a restart in new processes, on a spare
        node too); else the newest step on storage that verifies (one that does not is
        skipped with a warning). Collective under torch.distributed (all ranks agree on
        the step).

        A saved tensor ``state`` has no place for is not loaded, and a value of ``state``
        the step has none for keeps its own; rank 0 names both in one line of the job log
        (``"warn"``). ``on_unexpected`` / ``on_missing`` = ``"error"`` refuses such a load
        (CheckpointError on every rank, nothing written), ``"ignore"`` says nothing
        (:mod:`hpctrain.checkpoint.fit`). A restore from memory follows the same rules; a
        snapshot laid out otherwise than ``state`` is not restored, and the job log says so.
        """
        fit = self._fit(on_unexpected, on_missing)
        with progress.phase("loading"):
            self.wait()
            assert self._memory is not None, "load_latest() on a closed CheckpointManager"
            step, line = self._memory.restore(state, self.latest_step, self.unpickle, fit)
            self._say(line)
            if step is None:
                lines: dict[int, str] = {}

                def attempt(s: int) -> None:
                    lines[s] = self._load(s, state, verify, fit, listed=True)

                step = self.first_loadable(attempt)
                self._say(lines.get(step, "") if step is not None else "")
            self._memory.loaded(step, state)
            progress.resumed(step)   # where the steps count from, for a crash's position
            return step

    def first_loadable(self, attempt: Callable[[int], Any],
                       step: int | None = None) -> int | None:
        """The newest committed step (or ``step``) on which ``attempt(step)`` succeeds on
        every rank, or None; collective: every rank calls it and gets the same step.

        ``attempt`` raises CheckpointCorrupt for a damaged step: it is skipped with a
        RuntimeWarning and the next older step tried (``step``, asked for by name, is
        not skipped: CheckpointError on every rank); CheckpointError for the caller's
        mistake, raised on every rank. Shared by :meth:`load_latest` and DeepSpeed's loader.
        """
        for s in [step] if step is not None else \
                reversed(catalog.agreed_steps(self.comm, self.root)):
            outcome: tuple[str, str] | None = None
            try:
                attempt(s)
            except CheckpointCorrupt as exc:
                outcome = ("corrupt", str(exc))
            except CheckpointError as exc:  # the caller's mistake: raise it on every rank
                outcome = ("error", str(exc))
            outcomes = self.comm.outcomes(outcome)
            if not outcomes:
                return s
            errors = [msg for kind, msg in outcomes if kind == "error" or step is not None]
            if errors:
                raise CheckpointError(errors[0])
            warnings.warn(f"hpctrain: skipping checkpoint step {s}: {outcomes[0][1]}",
                          RuntimeWarning, stacklevel=3)
        return None

    def load(self, step: int, state: dict, verify: bool | None = None, *,
             on_unexpected: str = "warn", on_missing: str = "warn") -> None:
        """Load ``step`` into ``state`` in place; CheckpointError if absent or damaged
        (CheckpointCorrupt: failed verification). What does not fit ``state``: as
        :meth:`load_latest`. Collective under torch.distributed: a rank's refusal is
        raised on every rank (the others' states may be loaded already, but for a
        refusal of what does not fit, which every rank makes before it writes)."""
        fit = self._fit(on_unexpected, on_missing)
        self.wait()
        with progress.phase("loading"):
            line, refused, outcome = "", None, None
            try:
                line = self._load(step, state, verify, fit)
            except CheckpointError as exc:
                refused = exc
                outcome = (isinstance(exc, CheckpointCorrupt), str(exc))
            outcomes = self.comm.outcomes(outcome)
            if refused is not None:
                raise refused
            if outcomes:        # another rank's: raised here too, not left to hang
                corrupt, message = outcomes[0]
                raise (CheckpointCorrupt if corrupt else CheckpointError)(message)
            self._say(line)
        progress.resumed(step)

    @staticmethod
    def _fit(on_unexpected: str, on_missing: str) -> Any:
        """The caller's choice, checked before anything is read (CheckpointError)."""
        from hpctrain.checkpoint.fit import Fit

        return Fit(on_unexpected, on_missing)

    def _say(self, line: str) -> None:
        """A load's line of the job log, by rank 0 alone (one line per load, not per rank)."""
        if line and self.comm.rank == 0:
            from hpctrain.checkpoint.peerload import say

            say(line)

    def _load(self, step: int, state: dict, verify: bool | None, fit: Any,
              listed: bool = False) -> str:
        """Load ``step`` from storage; the job log's line on what did not fit ('' if none).
        Collective: every rank agrees before the first write, so that a rank's refusal
        (what does not fit, a damaged manifest, a step it does not see) leaves every rank's
        state untouched, raised on each (CheckpointCorrupt where one rank's is)."""
        agreed = False

        def agree(outcome: tuple[bool, str] | None, mine: Exception | None = None) -> None:
            nonlocal agreed
            agreed = True
            outcomes = self.comm.outcomes(outcome)
            if mine is not None:
                raise mine
            if outcomes:
                corrupt = any(c for c, _ in outcomes)
                raise (CheckpointCorrupt if corrupt else CheckpointError)(
                    next(m for c, m in outcomes if c == corrupt))

        try:
            return self._load_here(step, state, verify, fit, listed, lambda: agree(None))
        except CheckpointError as exc:
            if not agreed:
                agree((isinstance(exc, CheckpointCorrupt), str(exc)), exc)
            raise

    def _load_here(self, step: int, state: dict, verify: bool | None, fit: Any, listed: bool,
                   ready: Callable[[], None]) -> str:
        """This rank's part of :meth:`_load`; ``ready()``: the agreement."""
        from hpctrain.checkpoint.loader import load_step

        path = self.root / step_dirname(step)
        if not path.is_dir() and listed:
            raise CheckpointError(
                f"rank {self.comm.rank} does not see {path}, which rank 0 listed: this node's "
                "view of the file system is stale (NFS: mount with lookupcache=positive or "
                "none; Lustre: check the client's connection) or the root is not shared")
        if not path.is_dir():
            raise CheckpointError(f"no checkpoint for step {step} in {self.root}: "
                                  f"choose one of {storage.committed_steps(self.root)}")
        from hpctrain.checkpoint.remap import saved_rank

        rank = self.comm.rank
        try:   # this rank's part of it: the head and its own record
            manifest = read_rank_view(path, rank)
            # the data-parallel width changed (a shrink, a growing back): another rank's
            # part, the same stage and slice of a replica (hpctrain.checkpoint.remap)
            rank = saved_rank(rank, self.comm.world, manifest.layout, manifest.world_size)
            if rank != self.comm.rank:
                manifest = read_rank_view(path, rank)
        except CheckpointError as exc:
            raise CheckpointCorrupt(str(exc)) from None
        self.check_trusted()
        if manifest.kind != "torch":
            raise CheckpointError(f"step {step} is a {manifest.kind} checkpoint: "
                                  "load it with hpctrain.checkpoint.load_deepspeed")
        misfit = load_step(path, manifest, state, rank,
                           self.verify if verify is None else verify, self.unpickle, fit,
                           ready)
        return misfit.line(self.comm.rank if self.comm.active else None)

    def check_trusted(self) -> None:
        """Refuse a root that somebody else could have written (planted steps, pickles that
        run code), unless the caller said it trusts it."""
        why = None if self.trust else storage.untrusted(self.root)
        if why:
            raise CheckpointError(
                f"not using checkpoint root {self.root}: {why}. Use a directory of your own "
                f"(mkdir -m 700 DIR); if you trust whoever writes there (a team's shared "
                "root), pass CheckpointManager(..., trust=True); to read the tensors alone, "
                "hpctrain.checkpoint.read_tensors(step_dir) unpickles nothing")

    def list(self, verify: bool = False) -> list[catalog.StepInfo]:
        """Committed steps, oldest first, with size, time and validity."""
        return catalog.list_steps(self.root, verify)

    def close(self) -> None:
        """Flush an in-flight save and release the root lock."""
        try:
            if getattr(self, "_bg", None) is not None:
                self._bg.collect()
        finally:
            if getattr(self, "_memory", None) is not None:
                self._memory.close()
            for removal in getattr(self, "_removals", ()):
                removal.result()  # remove_tree ignores errors: this only waits
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
