"""Fast, durable, checksummed file writes and reads (no torch).

Writes go through O_DIRECT with two page-aligned bounce buffers when the file system
allows it (ext4, xfs, Lustre): the page cache is bypassed, so writing costs what
``dd oflag=direct`` costs, while the checksum and the copy into the next bounce buffer
overlap with the write in flight (the checksum, numpy copies and pwrite all release
the GIL).
Where O_DIRECT is refused (tmpfs, some FUSE/overlay mounts) a buffered write + fsync is
used instead. Either way the file is fsynced before the function returns.
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
    fn = checksum.get(algorithm)
    fd = -1
    if direct and hasattr(os, "O_DIRECT"):
        try:
            fd = _open(path, True)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this file system has no O_DIRECT
                raise
    try:
        if fd >= 0:
            result = _write_direct(fd, segments, fn)
        else:
            fd = _open(path, False)
            result = _write_buffered(fd, segments, fn)
        fault("file-before-fsync")
        os.fsync(fd)
    finally:
        if fd >= 0:
            os.close(fd)
    return result


def _write_buffered(fd: int, segments: Sequence, fn: Checksum
                    ) -> tuple[int, list[tuple[int, int, int]]]:
    blocks, offset = [], 0
    for seg in segments:
        arr = _as_bytes(seg)
        crc = Task(fn, arr) if arr.nbytes > BOUNCE else None  # overlaps the write
        _pwrite_all(fd, memoryview(arr), offset)
        blocks.append((offset, arr.nbytes, crc.result() if crc else fn(arr)))
        offset += arr.nbytes
    return offset, blocks


def _write_direct(fd: int, segments: Sequence, fn: Checksum
                  ) -> tuple[int, list[tuple[int, int, int]]]:
    arrs = _bounce_buffers()
    pending: list[Task | None] = [None, None]
    blocks, offset, file_off, k, pos = [], 0, 0, 0, 0
    try:
        for seg in segments:
            arr = _as_bytes(seg)
            blocks.append((offset, arr.nbytes, fn(arr)))
            offset += arr.nbytes
            i = 0
            while i < arr.nbytes:
                n = min(arr.nbytes - i, BOUNCE - pos)
                arrs[k][pos:pos + n] = arr[i:i + n]
                pos, i = pos + n, i + n
                if pos == BOUNCE:
                    pending[k] = Task(_pwrite_all, fd, memoryview(arrs[k]), file_off)
                    file_off, k, pos = file_off + BOUNCE, k ^ 1, 0
                    if pending[k] is not None:
                        pending[k].result()  # buffer k is free again (raises ENOSPC etc.)
                        pending[k] = None
        if pos:
            padded = -(-pos // ALIGN) * ALIGN  # O_DIRECT writes whole aligned blocks
            arrs[k][pos:padded] = 0
            pending[k] = Task(_pwrite_all, fd, memoryview(arrs[k])[:padded], file_off)
        for fut in pending:
            if fut is not None:
                fut.result()
        if pos:
            os.ftruncate(fd, offset)  # drop the alignment padding
    finally:
        for task in pending:  # never leave a write running into a reused buffer
            if task is not None and not task.done():
                try:
                    task.result()
                except OSError:
                    pass
    return offset, blocks


def read_into(fd: int, offset: int, dest: np.ndarray) -> None:
    """Fill ``dest`` (uint8 view) from ``fd`` at ``offset``; EOF early is an error."""
    view = memoryview(dest)
    while len(view):
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise EOFError(f"file ends at byte {offset}, {len(view)} bytes short")
        view, offset = view[n:], offset + n
