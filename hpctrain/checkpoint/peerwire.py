"""The wire of peer copies (:mod:`hpctrain.checkpoint.peers`): a header line (the copies'
secret, whose state, which step, how many bytes), the partner's answer (:data:`READY`, or
:data:`NO_ROOM` when its node memory cannot hold the copy), the copy's bytes, received
straight into the pages of its slot in node memory, and the partner's acknowledgement (the
step, once the copy is whole there): only then does the sender count the step as held by
its partner.

A partner receives every snapshot of its ward, each the size of the last: the slot files'
mappings are kept from one copy to the next (:class:`Slots`), so a copy costs one copy of
its bytes out of the socket and no page faults. Mapping each copy afresh faulted in every
4 KiB page again: 32 MB received over loopback took 39 ms of CPU that way and 24 ms with
the mapping kept (this machine kind; ``benchmarks/peer_bench.py`` measures the step).
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import struct
from pathlib import Path

from hpctrain.checkpoint import peerfile

BLOCK = 4 << 20                       # bytes received per read


HEADER_S = 10.0                       # a header begun must end within this
DATA_S = 120.0                        # a copy's bytes stall no longer than this
READY, NO_ROOM = b"+", b"-"           # the partner's answer to a header
ACK = struct.Struct("<q")             # the step of a copy received whole


class NoRoom(OSError):
    """Node memory cannot hold a copy (``/dev/shm`` or the job's memory is full)."""


def header(secret: str, rank: int, step: int, nbytes: int) -> bytes:
    """The line a copy of ``rank``'s state at ``step``, of ``nbytes`` bytes, is sent after."""
    return json.dumps({"secret": secret, "rank": rank, "step": step,
                       "nbytes": nbytes}).encode() + b"\n"


def read_header(conn: socket.socket) -> dict | None:
    """The next copy's header line (JSON: secret, rank, step, nbytes), or None. The wait
    for its first byte is the time between snapshots (no limit); the rest comes within
    HEADER_S, or the connection is given up."""
    try:      # (a sender gone meanwhile resets the connection: no copy, said by no one)
        conn.settimeout(None)
        line = conn.recv(1)
        conn.settimeout(HEADER_S)
        while line and not line.endswith(b"\n") and len(line) < 4096:
            got = conn.recv(1)
            if not got:
                return None
            line += got
        head = json.loads(line)
        head["rank"], head["step"] = int(head["rank"]), int(head["step"])
        head["nbytes"] = int(head["nbytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return head if head["nbytes"] >= peerfile.TRAILER.size else None


def reserve(fd: int, nbytes: int) -> None:
    """Make ``nbytes`` of the file ``fd`` real pages now: a tmpfs that cannot hold them
    refuses here (:class:`NoRoom`), not with SIGBUS at the first write into its mapping."""
    try:
        os.posix_fallocate(fd, 0, max(nbytes, 1))
    except OSError as exc:
        raise NoRoom(exc.errno, exc.strerror) from None


def open_own(path: Path) -> int:
    """``path`` opened read-write, made (mode 600) if absent, never through a symlink (the
    directory is the user's own; this is the second guard)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)


class Slots:
    """The slot files one connection receives into, each kept mapped while it is the same
    file of the same size (a file removed meanwhile, e.g. by ``forget_others``, or a copy
    of another size is mapped afresh)."""

    def __init__(self) -> None:
        self._maps: dict[Path, tuple[int, mmap.mmap]] = {}

    def receive(self, conn: socket.socket, path: Path, size: int, step: int) -> bool:
        """``size`` bytes from ``conn`` into the copy file ``path``, in place (spoiled first,
        so that only a whole copy reads as one; its pages reserved, else the sender hears
        :data:`NO_ROOM` and :class:`NoRoom` is raised), then acknowledged; False when the
        sender went away. A copy that arrives whole is untorn: a sender cuts its send
        short before the staging memory it reads is written again
        (``PeerCopies.before_stage``)."""
        try:
            pages = self._pages(path, size)
        except NoRoom:
            conn.sendall(NO_ROOM)
            raise
        conn.sendall(READY)
        conn.settimeout(DATA_S)
        view, got = memoryview(pages), 0
        try:
            while got < size:
                n = conn.recv_into(view[got:], min(BLOCK, size - got))
                if not n:
                    return False
                got += n
            conn.sendall(ACK.pack(step))
        except OSError:          # the sender went away, or stalled past DATA_S
            return False
        finally:
            view.release()
        return True

    def _pages(self, path: Path, size: int) -> mmap.mmap:
        fd = open_own(path)
        try:
            peerfile.spoil(fd)
            st = os.fstat(fd)
            kept = self._maps.get(path)
            if kept is not None and kept[0] == st.st_ino and len(kept[1]) == size == st.st_size:
                return kept[1]
            if kept is not None:
                kept[1].close()
                del self._maps[path]
            os.ftruncate(fd, size)
            peerfile.spoil(fd)        # (the end moved: what lies there now is no trailer)
            try:
                reserve(fd, size)
            except NoRoom:
                os.ftruncate(fd, 0)
                raise
            pages = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._maps[path] = (st.st_ino, pages)
        return pages

    def close(self) -> None:
        for _, pages in self._maps.values():
            pages.close()
        self._maps.clear()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock`` (ConnectionError when it closes first)."""
    got = b""
    while len(got) < n:
        more = sock.recv(n - len(got))
        if not more:
            raise ConnectionError("the partner closed the connection")
        got += more
    return got


def shutdown(sock: socket.socket) -> None:
    """Shut ``sock`` both ways (a thread blocked on it wakes), if it still can be."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def release(pages: mmap.mmap) -> None:
    """Unmap ``pages`` unless a tensor still views them (a kept snapshot of the old layout:
    then they go with it)."""
    try:
        pages.close()
    except BufferError:
        pass
