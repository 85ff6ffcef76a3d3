"""Where each key's lines start in the job index's log: small bucket files of byte offsets,
so a lookup reads one bucket and seeks, however long the history has grown.

The log (``jobs.jsonl``) stays the truth, and the only file older hpctrain versions know:
one JSON line per entry, appended under ``flock(LOCK_EX)`` on the log itself. Beside it,
``jobs.idx/`` holds

``00`` .. ``ff``
    the buckets: one line ``"KEY" OFFSET`` for each key of each log line (``OFFSET``: where
    the line starts); a key's bucket is ``crc32("KEY") % 256``;
``state``
    the commit record (JSON): how many bytes of the log the buckets cover (always up to a
    newline), the crc32 of the bytes just before that point (is this still the log they
    were built from?), and each bucket's committed length and crc32.

Everything happens under the log's flock: shared to read, exclusive to write, so an older
hpctrain's append never lands in the middle of an indexing pass. A write appends to the
log, then indexes from the covered point to the end (its own lines and whatever an older
writer appended meanwhile), appends to the touched buckets at their committed lengths and
last replaces ``state`` (rename): a crash before the rename leaves bytes past a bucket's
committed length, which readers never read and the next writer cuts off. A reader that
finds lines past the covered point indexes them first: the first run after an upgrade
indexes the whole log (the migration). Whatever does not add up (a checksum, a bucket
shorter than committed, an offset whose line does not carry its key) has the index
rebuilt from the log. Nothing is fsync'ed: a lost write is found by those checks.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generic, Iterable, Iterator, TypeVar

from hpctrain import access
from hpctrain.errors import AccessError
from hpctrain.jobs.paths import ENV_VAR

T = TypeVar("T")
# a log line -> (its value, its keys), or None for a damaged line (skipped, never indexed)
Parse = Callable[[bytes], tuple[T, Iterable[str]] | None]

BUCKETS = 256
VERSION = 1
FINGERPRINT = 256            # bytes before the covered point that identify the log
CHUNK = 1 << 20              # forward reads (indexing a tail, the migration)
BLOCK = 1 << 15              # the first backward read (status: the newest entries)
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


class Stale(Exception):
    """The index does not match the log: rebuild it (:meth:`Store.rebuild`) and ask again."""


@dataclass
class State:
    """The commit record: what the buckets cover, and what they must hold."""

    covered: int = 0          # bytes of the log indexed (just after a newline, or 0)
    tail: int = 0             # crc32 of the FINGERPRINT bytes before ``covered``
    sizes: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    crcs: list[int] = field(default_factory=lambda: [0] * BUCKETS)


def _key(key: str) -> tuple[bytes, int]:
    """A key as written in its bucket (JSON: any character is safe), and its bucket."""
    # Slurm ids need no escaping: skip json.dumps, which the migration would call 100,000 times
    enc = b'"%s"' % key.encode() if key.isascii() and key.isalnum() else json.dumps(key).encode()
    return enc, zlib.crc32(enc) % BUCKETS


class Store(Generic[T]):
    """One session on the log and its index, under the log's lock (a context manager).

    ``create``: a writer's session (the log is made if missing, locked exclusively);
    otherwise a reader's (shared lock; no log yet is no entries). Raises AccessError
    naming the path and the fix when the log or the index is not safely the user's.
    """

    def __init__(self, log: Path, parse: Parse[T], *, create: bool = False) -> None:
        self.log, self.parse, self.create = log, parse, create
        self.dir = log.with_suffix(".idx")
        self.fd: int | None = None
        self.writable = self.exclusive = False
        self.state: State | None = None               # None until synced with the log
        self.pending: dict[str, list[int]] = {}       # indexed in memory only (read-only)

    def __enter__(self) -> "Store[T]":
        if self.create:
            why = access.own_dir(self.log.parent, 0o700)
            if why is None:
                try:
                    # the record of one's jobs is private; never written through a symlink
                    self.fd = os.open(self.log, os.O_RDWR | os.O_APPEND | os.O_CREAT
                                      | os.O_NOFOLLOW, 0o600)
                    self.writable = True
                except OSError as exc:
                    why = f"{self.log.name}: {exc.strerror}"
            if self.fd is None:
                raise AccessError(f"not recording jobs in {self.log.parent}: {why}. Point "
                                  f"{ENV_VAR} at a directory of your own")
        else:
            self.fd = self._open_to_read()
            if self.fd is None:
                return self
        self.exclusive = self.create
        fcntl.flock(self.fd, fcntl.LOCK_EX if self.create else fcntl.LOCK_SH)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)      # releases the lock
            self.fd = None

    def _open_to_read(self) -> int | None:
        """The log, read-write if it may be (None: no log yet, so no entries). Read-write
        although a reader only reads: under NFS, flock is a POSIX lock, and the exclusive
        one that indexing a tail needs wants a descriptor open for writing."""
        flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW
        while True:
            try:
                fd = os.open(self.log, flags)
                self.writable = (flags & os.O_RDWR) != 0
                return fd
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno in READ_ONLY and flags & os.O_RDWR:
                    flags = os.O_RDONLY | os.O_NOFOLLOW    # a read-only home: still readable
                    continue
                why = ("it is a symlink, which hpctrain never follows" if exc.errno == errno.ELOOP
                       else exc.strerror)
                raise AccessError(f"not reading jobs from {self.log}: {why}. Remove it, or "
                                  f"point {ENV_VAR} at a directory of your own") from None

    # ---- lookups ----------------------------------------------------------------------
    def offsets(self, key: str) -> list[int]:
        """Where the lines carrying ``key`` start, oldest first (check each with :meth:`at`).
        Raises Stale when the key's bucket is damaged."""
        if self.fd is None:
            return []
        if self.state is None:
            self._sync()
        assert self.state is not None
        enc, bucket = _key(key)
        found = list(self.pending.get(key, ()))
        if self.state.sizes[bucket]:
            # C-speed search of one bucket (~1/256 of the keys), no per-line Python loop
            data, needle = b"\n" + self._bucket(bucket), b"\n" + enc + b" "
            i = data.find(needle)
            while i >= 0:
                end = data.index(b"\n", i + 1)
                found.append(int(data[i + len(needle):end]))
                i = data.find(needle, end)
        return sorted(found)

    def at(self, offset: int, key: str) -> T:
        """The value of the line at ``offset``; Stale unless that line carries ``key``."""
        assert self.fd is not None
        parts, pos, size = [], offset, 4096
        while True:
            data = os.pread(self.fd, size, pos)
            cut = data.find(b"\n")
            parts.append(data if cut < 0 else data[:cut])
            if cut >= 0 or not data:
                break
            pos, size = pos + len(data), min(size * 4, CHUNK)
        parsed = self.parse(b"".join(parts)) if cut >= 0 else None
        if parsed is None or key not in parsed[1]:
            raise Stale(f"{self.dir}: no line of {key!r} at {offset}")
        return parsed[0]

    def newest(self) -> Iterator[T]:
        """The log's entries, newest first, read backwards from its end: the cost grows
        with how many are taken, not with the history. Damaged lines are skipped; bytes
        after the last newline (a write cut short) are no line yet."""
        if self.fd is None:
            return
        pos, block, buf, cut_tail = os.fstat(self.fd).st_size, BLOCK, b"", False
        while pos > 0:
            step = min(block, pos)
            pos, block = pos - step, min(block * 2, CHUNK)
            buf = os.pread(self.fd, step, pos) + buf
            lines = buf.split(b"\n")
            if len(lines) == 1:
                continue                     # inside one long line
            buf = lines[0]                   # may start before ``pos``: kept for later
            body = lines[1:] if cut_tail else lines[1:-1]
            cut_tail = True
            for line in reversed(body):
                parsed = self.parse(line)
                if parsed is not None:
                    yield parsed[0]
        parsed = self.parse(buf) if cut_tail and buf else None
        if parsed is not None:
            yield parsed[0]

    def values(self) -> Iterator[T]:
        """Every entry, oldest first (the whole log: for the rare caller that needs it)."""
        if self.fd is not None:
            for _, line in self._lines(0, os.fstat(self.fd).st_size):
                parsed = self.parse(line)
                if parsed is not None:
                    yield parsed[0]

    # ---- writing ----------------------------------------------------------------------
    def append(self, data: bytes) -> None:
        """Append complete lines to the log, then index them (a ``create`` session)."""
        assert self.fd is not None and self.exclusive
        self._own_dir()             # refused before anything is written
        end = os.fstat(self.fd).st_size
        if end and os.pread(self.fd, 1, end - 1) != b"\n":
            data = b"\n" + data     # a crashed write's fragment stays its own (damaged) line
        while data:                 # O_APPEND: at the end, which the lock keeps ours
            data = data[os.write(self.fd, data):]
        self._sync()

    def rebuild(self) -> None:
        """Index the whole log again (the log is the truth)."""
        if self.fd is not None:
            self._sync(rebuild=True)

    def _sync(self, rebuild: bool = False) -> None:
        """Bring the index up to the log's end: index the tail an older writer (or the
        last crash) left, or everything when the index is missing or does not match."""
        assert self.fd is not None
        state = None if rebuild else self._read_state()
        if state is not None and not self._unindexed(state.covered):
            self.state, self.pending = state, {}
            return
        if self.writable and not self.exclusive:
            # unlock, then lock exclusively: converting in place can deadlock two readers
            # (NFS turns flock into POSIX locks, whose upgrades wait on each other)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            self.exclusive = True
            state = None if rebuild else self._read_state()  # another may have caught up
        state = state or State()
        keys, covered = self._scan(state.covered)
        self.state, self.pending = state, {}
        if covered == state.covered:
            return                  # nothing new, or only a cut-short write
        if self.exclusive:
            try:
                self.state = self._commit(state, keys, covered)
                return
            except Stale:
                self._sync(rebuild=True)
                return
            except OSError:
                pass                # a full disk, a read-only index: answer from memory
        self.pending = keys

    def _unindexed(self, covered: int) -> bool:
        """Are there complete lines past ``covered``? (Not for a cut-short write alone:
        that would have every lookup lock exclusively until the next append.)"""
        assert self.fd is not None
        end = os.fstat(self.fd).st_size
        return end > covered and (end - covered > BLOCK
                                  or b"\n" in os.pread(self.fd, end - covered, covered))

    def _scan(self, start: int) -> tuple[dict[str, list[int]], int]:
        """The keys of the complete lines from ``start`` on, and where those lines end."""
        assert self.fd is not None
        keys: dict[str, list[int]] = {}
        covered = start
        for offset, line in self._lines(start, os.fstat(self.fd).st_size):
            parsed = self.parse(line)
            for key in parsed[1] if parsed is not None else ():
                keys.setdefault(key, []).append(offset)
            covered = offset + len(line) + 1
        return keys, covered

    def _own_dir(self) -> None:
        why = access.own_dir(self.dir, 0o700, parents=False)
        if why:
            raise AccessError(f"not indexing jobs in {self.dir}: {why}. Remove it (hpctrain "
                              f"rebuilds it from {self.log.name}), or point {ENV_VAR} at a "
                              "directory of your own")

    def _commit(self, state: State, keys: dict[str, list[int]], covered: int) -> State:
        self._own_dir()
        lines: dict[int, list[bytes]] = {}
        for key, offs in keys.items():
            enc, bucket = _key(key)
            lines.setdefault(bucket, []).extend(b"%s %d\n" % (enc, o) for o in offs)
        new = State(covered, self._tail(covered), list(state.sizes), list(state.crcs))
        for bucket, chunk in lines.items():
            data, at = b"".join(chunk), new.sizes[bucket]
            fd = os.open(self.dir / f"{bucket:02x}", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW,
                         0o600)
            try:
                if os.fstat(fd).st_size < at:
                    raise Stale(f"{self.dir}: bucket {bucket:02x} lost committed lines")
                os.ftruncate(fd, at)        # what a crashed writer left uncommitted
                done = 0
                while done < len(data):
                    done += os.pwrite(fd, data[done:], at + done)
            finally:
                os.close(fd)
            new.sizes[bucket] += len(data)
            new.crcs[bucket] = zlib.crc32(data, new.crcs[bucket])   # crc of the whole bucket
        record = json.dumps({"version": VERSION, "covered": new.covered, "tail": new.tail,
                             "sizes": new.sizes, "crcs": new.crcs}).encode()
        tmp = self.dir / "state.tmp"     # one writer at a time: the lock is held
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            while record:
                record = record[os.write(fd, record):]
        finally:
            os.close(fd)
        os.replace(tmp, self.dir / "state")    # the commit: atomic, also over NFS
        return new

    # ---- reading the files ------------------------------------------------------------
    def _read_state(self) -> State | None:
        """The commit record, if it is whole and describes this log; else None."""
        assert self.fd is not None
        try:
            rec = json.loads(_read(self.dir / "state"))
            state = State(int(rec["covered"]), int(rec["tail"]), [int(s) for s in rec["sizes"]],
                          [int(c) for c in rec["crcs"]])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if (rec.get("version") != VERSION or len(state.sizes) != BUCKETS
                or len(state.crcs) != BUCKETS or state.covered < 0
                or state.covered > os.fstat(self.fd).st_size
                or self._tail(state.covered) != state.tail):
            return None                 # another log (replaced, truncated, edited)
        return state

    def _tail(self, covered: int) -> int:
        assert self.fd is not None
        n = min(FINGERPRINT, covered)
        return zlib.crc32(os.pread(self.fd, n, covered - n))

    def _bucket(self, bucket: int) -> bytes:
        """A bucket's committed lines; Stale when they are not what the state says."""
        assert self.state is not None
        size = self.state.sizes[bucket]
        try:
            data = _read(self.dir / f"{bucket:02x}", size)
        except OSError:
            data = b""
        if len(data) != size or zlib.crc32(data) != self.state.crcs[bucket]:
            raise Stale(f"{self.dir}: bucket {bucket:02x} is damaged")
        return data

    def _lines(self, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """(offset, line) of the complete lines in [start, end), oldest first."""
        assert self.fd is not None
        pos, carry = start, b""
        while pos < end:
            chunk = os.pread(self.fd, min(CHUNK, end - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            data = carry + chunk
            lines = data.split(b"\n")
            carry = lines.pop()              # after the last newline: not a line yet
            offset = pos - len(data)
            for line in lines:
                yield offset, line
                offset += len(line) + 1


def _read(path: Path, limit: int | None = None) -> bytes:
    """A file of the index (never through a symlink): whole, or its first ``limit`` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        parts, got = [], 0
        while limit is None or got < limit:
            part = os.read(fd, CHUNK if limit is None else limit - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)
    finally:
        os.close(fd)
