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
import threading
import uuid
from pathlib import Path
from typing import Any, Callable

from hpctrain.checkpoint.manifest import parse_step_dirname
from hpctrain.errors import CheckpointError

LOCK_NAME = ".hpctrain-ckpt.lock"
TMP_PREFIX = ".tmp-"      # in-flight step directories: never a checkpoint, never pruned live
TRASH_PREFIX = ".trash-"  # renamed here first, then deleted: a crash leaves only trash
FAULT_ENV = "HPCTRAIN_CKPT_FAULT"


def fault(point: str) -> None:
    """Fault injection for the crash tests: SIGKILL this process at ``point``.

    ``HPCTRAIN_CKPT_FAULT=<point>`` kills at that point; unset it costs one dict lookup.
    """
    if os.environ.get(FAULT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def fsync_path(path: Path) -> None:
    """fsync a file or directory by path (directories make renames/creates durable)."""
    fd = os.open(path, os.O_RDONLY)  # read-only opens can fsync directories on Linux
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` durably and atomically (tmp file, fsync, rename, fsync dir)."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise io_error(f"write {path}", exc) from None
    fsync_path(path.parent)


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

    Two jobs on one root would prune each other's steps and race on ``latest``; the
    second one is refused with the holder's host and pid. The kernel drops the lock when
    the holder dies (kill -9 included), so there is no stale lock to clean up.
    """

    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_NAME
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(self.fd, 200, 0).decode(errors="replace").strip() or "unknown"
            self.release()
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise CheckpointError(
                    f"checkpoint root {root} is in use by another job ({holder}): give each "
                    "job its own root, or stop the other job") from None
            raise CheckpointError(f"cannot lock {self.path} ({exc.strerror}): on Lustre mount "
                                  "with -o flock, or use a root on a file system with locks") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"host={socket.gethostname()} pid={os.getpid()}\n".encode(), 0)

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


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def clean_leftovers(root: Path) -> list[str]:
    """Delete trash and interrupted saves left by a crash; only the lock holder calls this."""
    removed = []
    for name in os.listdir(root):
        if name.startswith(TRASH_PREFIX) or (name.startswith(TMP_PREFIX) and name != LOCK_NAME):
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
