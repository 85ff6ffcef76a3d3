"""Reading one committed step: its manifest, and the bytes of its tensors and files, each
checked once against the sums the manifest records (no torch, no numpy import: the
destinations are handed in).

The one reader behind loading (:mod:`~hpctrain.checkpoint.loader`), export
(:mod:`~hpctrain.checkpoint.export`), ``hpctrain ckpt verify`` (:func:`verify_step`)
and DeepSpeed's steps. A tensor is read in 8 MiB pieces straight into its destination,
each piece checksummed on a second thread while the next one is read (the checksums
release the GIL, so the read's copy from the page cache and the checksum run on two
cores at once); a whole file is checked block by block as it streams.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.checkpoint import checksum, ranksfile
from hpctrain.checkpoint.manifest import (MANIFEST, RANKS, Block, FileRecord, Manifest,
                                          RankRecords, TensorEntry, parse, parse_part)
from hpctrain.errors import CheckpointCorrupt, CheckpointError

if TYPE_CHECKING:
    import numpy as np

READ_CHUNK = 16 << 20  # large sequential reads; Lustre and local disks both like >= 1 MiB
PIECE = 8 << 20        # a tensor's read unit, each checksummed while the next is read


def read_manifest(step_dir: str | os.PathLike[str]) -> Manifest:
    """Read and validate the manifest of ``step_dir``, every rank's entries (of format 5:
    the head and every record of ``manifest.ranks``); CheckpointError if absent or bad."""
    step_dir = Path(step_dir)
    head = _read_head(step_dir)
    if head.ranks is None:
        return head
    path = step_dir / RANKS
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointCorrupt(f"cannot read {path}: {exc.strerror}") from None
    fn = checksum.get(head.checksum)
    view, pos = memoryview(data), 0

    def read(n: int) -> memoryview:
        nonlocal pos
        pos += n
        return view[pos - n:pos]

    if len(data) != head.ranks.size or _first_bad_block(read, head.ranks.blocks, fn):
        raise CheckpointCorrupt(f"{path} does not match the manifest's record of it "
                                "(truncated or damaged)")
    records = ranksfile.decode_all(path, data, head.world_size, fn)
    whole = _with_parts(head, [parse_part(rec, r, f"{path} (rank {r})")
                               for r, rec in enumerate(records)])
    names = {f.name for f in whole.files}
    for t in whole.tensors:
        if t.file not in names:
            raise CheckpointError(f"invalid manifest {step_dir / MANIFEST}: tensor {t.path}: "
                                  f"unknown file {t.file!r}")
    return whole


def read_rank_view(step_dir: str | os.PathLike[str], rank: int) -> Manifest:
    """What ``rank`` loads from ``step_dir``: of format 5, the head and its own record
    (rank 0's for a rank the step has none for: its extras are the ones handed out),
    not every rank's; of earlier formats, the whole manifest, which holds them all."""
    step_dir = Path(step_dir)
    head = _read_head(step_dir)
    if head.ranks is None:
        return head
    source = rank if rank < head.world_size else 0
    data = ranksfile.read_record(step_dir, source, head.world_size,
                                 checksum.get(head.checksum))
    part = parse_part(data, source, f"{step_dir / RANKS} (rank {source})")
    view = _with_parts(head, [part])
    view.parts = None   # a view, not every record: nothing to write back
    return view


def _with_parts(head: Manifest, parts: list[RankRecords]) -> Manifest:
    return dataclasses.replace(
        head, files=head.files + [f for p in parts for f in p.files],
        tensors=head.tensors + [t for p in parts for t in p.tensors],
        extras=[e for p in parts for e in p.extras], parts=parts)


def _read_head(step_dir: Path) -> Manifest:
    path = step_dir / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: {step_dir} is not a committed checkpoint "
                              "(an interrupted save); delete it") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from None
    return parse(data, where=str(path))


def read_into(fd: int, offset: int, dest: Any) -> None:
    """Fill ``dest`` (a writable uint8 buffer) from ``fd`` at ``offset``; EOF early is an
    error."""
    view = memoryview(dest)
    while len(view):
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise EOFError(f"file ends at byte {offset}, {len(view)} bytes short")
        view, offset = view[n:], offset + n


def _mismatch(path: Path, offset: int, length: int, detail: str) -> str:
    """The one wording of a checksum mismatch: the file, the bytes, what they hold."""
    return f"{path}: checksum mismatch in bytes [{offset}, {offset + length}) ({detail})"


def _first_bad_block(read: Callable[[int], memoryview], blocks: list[Block],
                    fn: checksum.Checksum) -> tuple[int, int, int, int] | None:
    """Check ``blocks`` over the bytes ``read(n)`` hands out in order (at most ``n`` at a
    time, empty at the end): the first block whose sum differs, as (offset, length, sum
    found, sum recorded), or None. EOFError(byte) when the bytes end early."""
    for off, length, want in blocks:
        value, left = 0, length
        while left:
            piece = read(min(left, READ_CHUNK))
            if not len(piece):
                raise EOFError(off + length - left)
            value = fn(piece, value)
            left -= len(piece)
        if value != want:
            return off, length, value, want
    return None


def verify_file(path: Path, rec: FileRecord, algorithm: str = checksum.LEGACY) -> str | None:
    """Stream ``path`` and check its size and every block's sum (``algorithm``, as the
    manifest names it); a problem string or None."""
    fn = checksum.get(algorithm)
    try:
        size = path.stat().st_size
        if size != rec.size:
            return f"{path} has {size} bytes, manifest says {rec.size} (truncated or damaged)"
        view = memoryview(bytearray(READ_CHUNK))
        with open(path, "rb", buffering=0) as f:
            _advise_sequential(f.fileno())
            bad = _first_bad_block(lambda n: view[:f.readinto(view[:n])], rec.blocks, fn)
    except EOFError as exc:
        return f"{path} ends early at byte {exc.args[0]}"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    if bad is None:
        return None
    off, length, value, want = bad
    return _mismatch(path, off, length, f"{algorithm} {value:#010x}, manifest {want:#010x}")


def verify_step(step_dir: str | os.PathLike[str]) -> list[str]:
    """All problems of one step directory (empty list: valid). Never raises for bad data."""
    try:
        reader = StepReader(step_dir)
    except CheckpointError as exc:
        return [str(exc)]
    return reader.verify_files()


class _Checker:
    """Sums the pieces of tensors read on a thread of its own, in read order; the entries
    whose sum differs are kept for :meth:`StepReader.check`."""

    def __init__(self, fn: checksum.Checksum) -> None:
        self.fn = fn
        self.queue: queue.Queue = queue.Queue(maxsize=8)  # bounds the lag to 64 MiB
        self.bad: list[TensorEntry] = []
        self.thread = threading.Thread(target=self._run, name="hpctrain-verify", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        value = 0
        while (item := self.queue.get()) is not None:
            if isinstance(item, threading.Event):  # check(): everything before is summed
                item.set()
                continue
            entry, piece, last = item
            value = self.fn(piece, value)
            if last:
                if value != entry.sum:
                    self.bad.append(entry)
                value = 0

    def add(self, entry: TensorEntry, piece: np.ndarray, last: bool) -> None:
        self.queue.put((entry, piece, last))

    def drain(self) -> None:
        done = threading.Event()
        self.queue.put(done)
        done.wait()

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join()


class StepReader:
    """One committed step opened for reading: its manifest, its files (each opened once,
    on first use) and, when ``verify``, every byte read checked against its sum.

    Use as a context manager (or :meth:`close`). With ``overlap`` (a load: many tensors
    at once) a tensor's sum is computed on a second thread while the next piece is read,
    so a mismatch surfaces at :meth:`check`, which the caller calls before it uses what
    it read; without (export: one tensor at a time, where a handoff per tensor would
    cost more than it saves) :meth:`read` sums as it reads and raises itself.
    """

    def __init__(self, step_dir: str | os.PathLike[str], manifest: Manifest | None = None,
                 verify: bool = True, overlap: bool = True) -> None:
        self.step_dir = Path(step_dir)
        self.manifest = read_manifest(self.step_dir) if manifest is None else manifest
        self.verify, self.overlap = verify, overlap
        self._fds: dict[str, int] = {}
        self._checker: _Checker | None = None   # started by the first verified read

    def check_sizes(self) -> str | None:
        """Cheap check (stat only): every file exists with its recorded size. None if fine."""
        return self.check_files({rec.name: rec.size for rec in self.manifest.files})

    def check_files(self, ends: dict[str, int]) -> str | None:
        """Cheap check (stat only) of the files a load reads (``ends``: each file's name and
        the end of the last byte read from it): each exists, at its recorded size where the
        manifest (a rank's view of it) records it, else at least that long. None if fine."""
        recorded = {rec.name: rec.size for rec in self.manifest.files}
        for name, end in ends.items():
            try:
                size = (self.step_dir / name).stat().st_size
            except OSError:
                return f"{self.step_dir / name} is missing"
            want = recorded.get(name)
            if size != (want if want is not None else max(size, end)):
                said = want if want is not None else f"at least {end}"
                return (f"{self.step_dir / name} has {size} bytes, manifest says {said} "
                        "(truncated?)")
        return None

    def verify_files(self) -> list[str]:
        """Read every byte of every file and check its blocks: the problems, one per bad
        file (or that this install cannot compute the manifest's checksum)."""
        try:
            checksum.get(self.manifest.checksum)
        except CheckpointError as exc:
            return [str(exc)]
        return [p for rec in self.manifest.files
                if (p := verify_file(self.step_dir / rec.name, rec, self.manifest.checksum))]

    def read(self, entry: TensorEntry, dest: np.ndarray) -> None:
        """Fill ``dest`` (a uint8 array of ``entry.nbytes``) with the entry's bytes; its sum
        is checked on the checker thread (see :meth:`check`), or here without ``overlap``."""
        fd, checker = self._fd(entry.file), self._start_checker()
        fn = checksum.get(self.manifest.checksum) if self.verify and not checker else None
        pos, off, value = 0, entry.offset, 0
        try:
            while True:
                piece = dest[pos:pos + PIECE]
                read_into(fd, off + pos, piece)
                pos += piece.nbytes
                if checker:
                    checker.add(entry, piece, pos >= dest.nbytes)
                elif fn:
                    value = fn(piece, value)
                if pos >= dest.nbytes:
                    break
        except (OSError, EOFError) as exc:
            raise CheckpointCorrupt(f"{self.step_dir / entry.file}: cannot read tensor "
                                    f"{entry.path} ({exc})") from None
        if fn and value != entry.sum:
            raise CheckpointCorrupt(self._damaged([entry]))

    def check(self) -> None:
        """Wait for the sums of every tensor read so far; CheckpointCorrupt naming the
        first damaged one."""
        if self._checker is None:
            return
        self._checker.drain()
        if self._checker.bad:
            raise CheckpointCorrupt(self._damaged(self._checker.bad))

    def _damaged(self, bad: list[TensorEntry]) -> str:
        e = bad[0]
        return (_mismatch(self.step_dir / e.file, e.offset, e.nbytes, f"tensor {e.path}")
                + f"; {len(bad)} damaged tensor(s)")

    def read_file(self, name: str, what: str) -> bytes:
        """The whole file ``name`` (holding ``what``, for the message), every block checked
        when verifying."""
        path = self.step_dir / name
        data = path.read_bytes()
        if not self.verify:
            return data
        rec = self.manifest.file(name)
        if len(data) != rec.size:
            raise CheckpointCorrupt(f"{path} has {len(data)} bytes, manifest says {rec.size}")
        view, pos = memoryview(data), 0

        def read(n: int) -> memoryview:  # slices, no copies
            nonlocal pos
            pos += n
            return view[pos - n:pos]

        bad = _first_bad_block(read, rec.blocks, checksum.get(self.manifest.checksum))
        if bad is not None:
            raise CheckpointCorrupt(_mismatch(path, bad[0], bad[1], what))
        return data

    def _fd(self, name: str) -> int:
        if name not in self._fds:
            fd = self._fds[name] = os.open(self.step_dir / name, os.O_RDONLY)
            _advise_sequential(fd)  # larger readahead
        return self._fds[name]

    def _start_checker(self) -> _Checker | None:
        if self.verify and self.overlap and self._checker is None:
            self._checker = _Checker(checksum.get(self.manifest.checksum))
        return self._checker

    def close(self) -> None:
        """Close the files and stop the checker thread (it sums what is queued first;
        nothing is raised: :meth:`check` is what reports a mismatch)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        checker, self._checker = self._checker, None
        if checker is not None:
            checker.stop()

    def __enter__(self) -> StepReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _advise_sequential(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
