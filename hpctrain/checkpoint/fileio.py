"""Fast, durable, checksummed file writes (no torch; reads: hpctrain.checkpoint.reader).

Writes go through O_DIRECT with two page-aligned bounce buffers when the file system
allows it (ext4, xfs, Lustre): the page cache is bypassed, so writing costs what
``dd oflag=direct`` costs, while the checksum and the copy into the next bounce buffer
overlap with the write in flight (the checksum, numpy copies and pwrite all release
the GIL).
Where O_DIRECT is refused (tmpfs, some FUSE/overlay mounts) a buffered write + fsync is
used instead. Either way the file is fsynced before it is closed.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from hpctrain.checkpoint import checksum
from hpctrain.checkpoint.checksum import Checksum
from hpctrain.checkpoint.storage import Task, fault

ALIGN = 4096
BOUNCE = 32 << 20  # two of these per writer: big enough for full-speed sequential I/O


_local = threading.local()


def _bounce_buffers() -> list[np.ndarray]:
    """Two page-aligned bounce buffers per calling thread, allocated once and reused."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = []
        for _ in range(2):
            raw = np.empty(BOUNCE + ALIGN, dtype=np.uint8)
            start = -raw.ctypes.data % ALIGN
            bufs.append(raw[start:start + BOUNCE])
        _local.bufs = bufs
    return bufs


def _as_bytes(seg: memoryview | bytes | np.ndarray) -> np.ndarray:
    return np.frombuffer(seg, dtype=np.uint8)


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _open(path: Path, direct: bool) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    return os.open(path, flags, 0o644)


def write_segments(path: Path, segments: Sequence[memoryview | bytes | np.ndarray],
                   direct: bool = True, algorithm: str = checksum.DEFAULT
                   ) -> tuple[int, list[tuple[int, int, int]]]:
    """Write ``segments`` back to back into ``path`` and fsync it.

    Returns (size, blocks) with one (offset, length, checksum) block per segment.
    OSError (ENOSPC, EDQUOT, EIO) propagates; the caller owns the cleanup.
    """
    out = SegmentFile(path, direct=direct, algorithm=algorithm)
    try:
        blocks = out.write(segments)
    except BaseException:
        out.abort()
        raise
    return out.close(), blocks


class SegmentFile:
    """One file written as segments back to back, in one or more :meth:`write` calls (a
    rank may learn what else it must write while its first segments are on their way to
    the disk), then :meth:`close`, which fsyncs it. Not thread-safe: one writer thread.

    O_DIRECT where the file system allows it: the segments are copied into two
    page-aligned bounce buffers, one filled (and checksummed) while the other is written.
    The buffers are the calling thread's: one O_DIRECT file open per thread at a time.
    """

    def __init__(self, path: Path, direct: bool = True,
                 algorithm: str = checksum.DEFAULT) -> None:
        self._fn: Checksum = checksum.get(algorithm)
        self._fd = -1
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self._fd = _open(path, True)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: this file system has no O_DIRECT
                    raise
        self.direct = self._fd >= 0
        if not self.direct:
            self._fd = _open(path, False)
        self.size = 0        # bytes of segments written so far
        self._file_off = 0   # direct: bytes handed to pwrite (whole bounce buffers)
        self._pos = 0        # direct: bytes waiting in the current bounce buffer
        self._k = 0          # direct: which bounce buffer is being filled
        self._pending: list[Task | None] = [None, None]
        self._bufs = _bounce_buffers() if self.direct else []
        self._synced = -1    # the size :meth:`sync` made durable (-1: never synced)
        self._syncing: Task | None = None  # a sync on a second thread (start_sync)

    def write(self, segments: Sequence[memoryview | bytes | np.ndarray]
              ) -> list[tuple[int, int, int]]:
        """Append ``segments``; one (offset, length, checksum) block per segment."""
        self._join_sync()
        blocks = []
        for seg in segments:
            arr = _as_bytes(seg)
            if self.direct:
                blocks.append((self.size, arr.nbytes, self._fn(arr)))
                self._copy_in(arr)
            else:
                crc = Task(self._fn, arr) if arr.nbytes > BOUNCE else None  # overlaps the write
                _pwrite_all(self._fd, memoryview(arr), self.size)
                blocks.append((self.size, arr.nbytes, crc.result() if crc else self._fn(arr)))
            self.size += arr.nbytes
        return blocks

    def _copy_in(self, arr: np.ndarray) -> None:
        bufs, i = self._bufs, 0
        while i < arr.nbytes:
            n = min(arr.nbytes - i, BOUNCE - self._pos)
            bufs[self._k][self._pos:self._pos + n] = arr[i:i + n]
            self._pos, i = self._pos + n, i + n
            if self._pos == BOUNCE:
                self._send(BOUNCE)
                self._pos = 0

    def _send(self, nbytes: int) -> None:
        """pwrite the first ``nbytes`` of the current bounce buffer on a second thread, then
        make the other buffer current once its own write is done (raising ENOSPC etc.)."""
        k = self._k
        self._pending[k] = Task(_pwrite_all, self._fd, memoryview(self._bufs[k])[:nbytes],
                                self._file_off)
        self._file_off += nbytes
        self._k = k ^ 1
        self._wait(self._k)

    def _wait(self, k: int) -> None:
        task, self._pending[k] = self._pending[k], None
        if task is not None:
            task.result()

    def start_sync(self) -> None:
        """Run :meth:`sync` on a second thread, while the caller does other work; the next
        :meth:`write` or :meth:`close` waits for it first (and raises its error)."""
        self._join_sync()
        self._syncing = Task(self.sync, name="hpctrain-ckpt-sync")

    def _join_sync(self) -> None:
        task, self._syncing = self._syncing, None
        if task is not None:
            task.result()

    def sync(self) -> None:
        """Make every segment written so far durable (its bytes and the file's size), and
        keep the file open for more. A rank syncs what it has written while it learns
        whether it must write more; in the usual case (nothing more) :meth:`close` then
        has nothing left to flush, so the disk's flush overlaps that wait.

        O_DIRECT: the partly filled bounce buffer is written padded to a whole block and
        stays current; bytes appended later fill it up and rewrite that block in place."""
        if self.direct:
            self._wait(0)
            self._wait(1)
            self._write_tail()
        os.fdatasync(self._fd)
        self._synced = self.size

    def _write_tail(self) -> None:
        """pwrite the current, partly filled bounce buffer (padded) at its place, then
        cut the padding off the file's end (direct only)."""
        if self._pos:
            padded = -(-self._pos // ALIGN) * ALIGN  # O_DIRECT writes whole blocks
            self._bufs[self._k][self._pos:padded] = 0
            _pwrite_all(self._fd, memoryview(self._bufs[self._k])[:padded], self._file_off)
            os.ftruncate(self._fd, self.size)  # drop the alignment padding

    def close(self) -> int:
        """Write what is left, fsync and close; return the file's size."""
        try:
            self._join_sync()
            if self.direct:
                self._wait(0)
                self._wait(1)
                if self.size != self._synced:
                    self._write_tail()
                self._pos = 0
            fault("file-before-fsync")
            if self.size != self._synced:
                os.fsync(self._fd)
        except BaseException:
            self.abort()
            raise
        os.close(self._fd)
        self._fd = -1
        return self.size

    def abort(self) -> None:
        """Close without fsync (the caller deletes the file): never leave a write running
        into a bounce buffer that will be reused."""
        for task in [*self._pending, self._syncing]:
            if task is not None and not task.done():
                try:
                    task.result()
                except OSError:
                    pass
        self._pending, self._syncing = [None, None], None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

