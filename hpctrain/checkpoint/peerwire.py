"""The wire of peer copies (:mod:`hpctrain.checkpoint.peers`): a header line, then a copy's
bytes, received straight into the pages of its slot in node memory.

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
from pathlib import Path

from hpctrain.checkpoint import peerfile

BLOCK = 4 << 20                       # bytes received per read


def header(token: str, rank: int, nbytes: int) -> bytes:
    """The line a copy of ``rank``'s of ``nbytes`` bytes is sent after."""
    return json.dumps({"token": token, "rank": rank, "nbytes": nbytes}).encode() + b"\n"


def read_header(conn: socket.socket) -> dict | None:
    """The next copy's header line (JSON: token, rank, nbytes), or None."""
    line = b""
    while not line.endswith(b"\n") and len(line) < 4096:
        got = conn.recv(1)
        if not got:
            return None
        line += got
    try:
        head = json.loads(line)
        head["rank"], head["nbytes"] = int(head["rank"]), int(head["nbytes"])
    except (ValueError, KeyError, TypeError):
        return None
    return head if head["nbytes"] >= peerfile.TRAILER.size else None


class Slots:
    """The slot files one connection receives into, each kept mapped while it is the same
    file of the same size (a file removed meanwhile, e.g. by ``forget_others``, or a copy
    of another size is mapped afresh)."""

    def __init__(self) -> None:
        self._maps: dict[Path, tuple[int, mmap.mmap]] = {}

    def receive(self, conn: socket.socket, path: Path, size: int) -> bool:
        """``size`` bytes from ``conn`` into the copy file ``path``, in place (spoiled first,
        so that only a whole copy reads as one); False when the sender went away. A copy
        that arrives whole is untorn: a sender cuts its send short before the staging
        memory it reads is written again (``PeerCopies.before_stage``)."""
        pages = self._pages(path, size)
        view, got = memoryview(pages), 0
        try:
            while got < size:
                n = conn.recv_into(view[got:], min(BLOCK, size - got))
                if not n:
                    return False
                got += n
        finally:
            view.release()
        return True

    def _pages(self, path: Path, size: int) -> mmap.mmap:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            peerfile.spoil(fd)
            st = os.fstat(fd)
            kept = self._maps.get(path)
            if kept is not None and kept[0] == st.st_ino and len(kept[1]) == size == st.st_size:
                return kept[1]
            if kept is not None:
                kept[1].close()
            os.ftruncate(fd, size)
            pages = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._maps[path] = (st.st_ino, pages)
        return pages

    def close(self) -> None:
        for _, pages in self._maps.values():
            pages.close()
        self._maps.clear()
