"""POSIX durability primitives for the checkpoint root (no torch).

Everything the commit protocol relies on lives here: fsync of files and directories,
atomic replace, the root lock, Lustre striping, scanning and crash-safe removal, and
the fault-injection points the kill -9 tests use.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from hpctrain import access, files
from hpctrain.checkpoint.manifest import parse_step_dirname
from hpctrain.errors import CheckpointError, StorageUnavailable
from hpctrain.files import fsync_path

LOCK_NAME = ".hpctrain-ckpt.lock"
TMP_PREFIX = ".tmp-"      # in-flight step directories: never a checkpoint, never pruned live
TRASH_PREFIX = ".trash-"  # renamed here first, then deleted: a crash leaves only trash
OLD_PREFIX = ".old-"      # a step being re-saved: put back if the new one never arrived
FAULT_ENV = "HPCTRAIN_CKPT_FAULT"
LOCK_WAIT_S = 120.0       # how long a job waits for a root locked by another holder
LOCK_POLL_S = 1.0


def fault(point: str) -> None:
    """Fault injection for the crash tests: SIGKILL this process at ``point``.

    ``HPCTRAIN_CKPT_FAULT=<point>`` kills at that point; unset it costs one dict lookup.
    """
    if os.environ.get(FAULT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` durably and atomically (tmp file, fsync, rename, fsync dir)."""
    try:
        files.atomic_write(path, data, durable=True, tmp_prefix=TMP_PREFIX, mode=mode)
    except OSError as exc:
        raise io_error(f"write {path}", exc) from None


def io_error(what: str, exc: OSError) -> CheckpointError:
    """A CheckpointError for an OSError, with the fix for the usual causes."""
    hint = {errno.ENOSPC: "the file system is full: free space, lower keep_last, or raise the quota",
            errno.EDQUOT: "the disk quota is exceeded: `lfs quota -u $USER <fs>`, prune or ask for more",
            errno.EACCES: "permission denied: choose a root you can write",
            errno.EROFS: "the file system is read-only: choose a writable root"}
    return CheckpointError(f"cannot {what}: {exc.strerror or exc} "
                           f"({hint.get(exc.errno, 'check the storage')})")


def check_root(root: Path) -> None:
    """Fail before training starts if ``root`` does not exist or is not writable."""
    if not root.is_dir():
        raise CheckpointError(f"checkpoint root {root} does not exist or is not a directory: "
                              f"create it (mkdir -p {root}) or pass another root")
    probe = root / f"{TMP_PREFIX}probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"checkpoint root {root} is not writable ({exc.strerror}): "
                              "fix its permissions or pass a writable root") from None


class RootLock:
    """An exclusive flock on ``root/.hpctrain-ckpt.lock`` held for the manager's lifetime.

    Two jobs on one root would prune each other's steps and race on ``latest``. The kernel
    drops the lock when its holder dies on this node, but a lock a *dead or evicted node*
    held on a shared file system lives on until the file system gives up on that client
    (Lustre's eviction, NFS's lease). So a held lock is waited for, up to ``wait_s``
    (saying so once), and then refused with the holder's host and pid as
    :class:`~hpctrain.errors.StorageUnavailable`: a job that dies of it is requeued, not
    failed as a user crash.
    """

    def __init__(self, root: Path, wait_s: float = LOCK_WAIT_S) -> None:
        self.path = root / LOCK_NAME
        self.fd: int | None = None
        # never through a planted symlink, never another user's file
        why = access.unsafe_reason(self.path) if os.path.lexists(self.path) else None
        try:
            if why is None:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            why = exc.strerror or str(exc)
        if why:
            raise CheckpointError(f"not using the lock file {self.path}: {why}. Remove it "
                                  "if it is yours, or use a checkpoint root of your own")
        deadline, told = time.monotonic() + wait_s, False
        while not self._try():
            holder = os.pread(self.fd, 200, 0).decode(errors="replace").strip() or "unknown"
            if time.monotonic() >= deadline:
                self.release()
                waited = f" (waited {wait_s:.0f} s)" if wait_s else ""
                raise StorageUnavailable(
                    f"checkpoint root {root} is locked by another job ({holder}){waited}: if "
                    "that job is running, give each job its own root or stop the other job; if "
                    "it is gone (its node died or was evicted), the file system releases its "
                    "lock once it gives up on that node: try again then")
            if not told:
                print(f"hpctrain: checkpoint root {root} is locked by {holder}; waiting up to "
                      f"{wait_s:.0f} s for it", file=sys.stderr, flush=True)
                told = True
            time.sleep(LOCK_POLL_S)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"host={socket.gethostname()} pid={os.getpid()}\n".encode(), 0)

    def _try(self) -> bool:
        """Take the lock if free; False while another holder has it."""
        assert self.fd is not None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            self.release()
            raise CheckpointError(f"cannot lock {self.path} ({exc.strerror}): on Lustre mount "
                                  "with -o flock, or use a root on a file system with locks") from None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def set_striping(path: Path, stripe_count: int | None) -> bool:
    """``lfs setstripe -c N path`` when ``lfs`` is on PATH; a silent no-op otherwise.

    New files in a striped directory inherit its layout, so large shard files spread over
    N OSTs. Returns whether striping was applied. A failing ``lfs`` (not a Lustre path)
    is ignored on purpose: the protocol must work unchanged on any POSIX file system.
    """
    lfs = shutil.which("lfs")
    if not stripe_count or lfs is None:
        return False
    done = subprocess.run([lfs, "setstripe", "-c", str(stripe_count), str(path)],
                          capture_output=True, timeout=60, check=False)
    return done.returncode == 0


def committed_steps(root: Path) -> list[int]:
    """Steps with a committed directory name, ascending (validity not checked)."""
    steps = []
    try:
        names = os.listdir(root)
    except OSError as exc:
        raise io_error(f"list {root}", exc) from None
    for name in names:
        step = parse_step_dirname(name)
        if step is not None:
            steps.append(step)
    return sorted(steps)


def trash(root: Path, name: str) -> Path:
    """Atomically move ``root/name`` out of the namespace (rename to trash, fsync root)."""
    target = root / f"{TRASH_PREFIX}{name}.{uuid.uuid4().hex[:8]}"
    os.rename(root / name, target)
    fsync_path(root)
    return target


def apply_modes(step_dir: Path, dir_mode: int, file_mode: int) -> None:
    """Give ``step_dir``, its subdirectories and files the access level's modes, whatever
    the writers' umask (DeepSpeed writes its own files with the default one)."""
    os.chmod(step_dir, dir_mode)
    for parent, dirs, names in os.walk(step_dir):
        for name in dirs:
            os.chmod(os.path.join(parent, name), dir_mode)
        for name in names:
            os.chmod(os.path.join(parent, name), file_mode)


def untrusted(root: Path) -> str | None:
    """Why ``root`` could hold somebody else's files (whose pickles could run code), or
    None: a symlink's target is judged, since the user chose the link."""
    return access.unsafe_reason(Path(os.path.realpath(root)))


def set_aside(root: Path, name: str) -> Path:
    """Move committed step ``root/name`` aside while it is re-saved (rename, fsync root)."""
    target = root / f"{OLD_PREFIX}{name}.{uuid.uuid4().hex[:8]}"
    os.rename(root / name, target)
    fsync_path(root)
    return target


def files_under(root: Path) -> list[Path]:
    """Every file below ``root`` (any depth), sorted."""
    return sorted(p for p in root.rglob("*") if p.is_file())


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root``: for files written by code that
    does not (DeepSpeed)."""
    found = files_under(root)
    for p in found:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in sorted({p.parent for p in found} | {root}, key=lambda p: -len(p.parts)):
        fsync_path(d)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def clean_leftovers(root: Path) -> list[str]:
    """Delete trash and interrupted saves left by a crash, and put back a step set aside
    for a re-save that never committed; only the lock holder calls this."""
    removed = []
    for name in sorted(os.listdir(root)):
        if name.startswith(OLD_PREFIX):
            step_name = name[len(OLD_PREFIX):].rsplit(".", 1)[0]
            if parse_step_dirname(step_name) is not None and not (root / step_name).exists():
                os.rename(root / name, root / step_name)  # the re-save never committed
                fsync_path(root)
                continue
        if name.startswith((TRASH_PREFIX, OLD_PREFIX)) or (
                name.startswith(TMP_PREFIX) and name != LOCK_NAME):
            remove_tree(root / name) if (root / name).is_dir() else (root / name).unlink(missing_ok=True)
            removed.append(name)
    return removed


class Task:
    """Run ``fn(*args)`` on its own (non-daemon) thread; ``result()`` joins and re-raises.

    Plain threads rather than concurrent.futures: executors refuse new work once the
    interpreter starts shutting down, which is exactly when an async save is flushed.
    """

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str = "hpctrain-io") -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever calls result()
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._value
