"""One peer copy of a snapshot, as it lies in node memory (:mod:`hpctrain.checkpoint.peers`).

A copy is the snapshot's bytes (*data*: each chunk at a 64-byte aligned offset, as the
snapshot's staging lays them out) followed by its *tail*: the pickled extras, a JSON meta
(step, rank, each chunk's place in the state, offset, size and checksum, the extras'
checksum; the durable format's algorithm) and a 16-byte trailer (the meta's length and a
magic). A rank's own copies lie in two buffers, each two files (its data is the snapshot's
staging memory itself, mapped from node memory: ``R.0.data``; ``R.0.meta`` its tail): the
newest snapshot, and the newest the partner is known to hold. A copy kept for a ward is one
file, data then tail, in one of two slots (``W.a.copy``, ``W.b.copy``) so that the copy
arriving never destroys the last whole one. A copy is spoiled (trailer zeroed, or its tail
removed) before it is rewritten: a reader never takes half of one for a copy, and the
checksums catch anything torn. A load decodes and verifies a copy whole (:func:`decode`)
before anything is written into the state (:func:`apply`): all or nothing.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from hpctrain.checkpoint import checksum, unpickle
from hpctrain.checkpoint.tree import Chunk, dtype_from_name, dtype_name, flatten, set_path

MAGIC = b"HPCTPEER"
TRAILER = struct.Struct("<Q8s")       # the meta's length, MAGIC: a copy's last 16 bytes
ALIGN = 64                            # a chunk's offset in the data (its dtype view needs it)
BLOCK = 8 << 20                       # bytes checksummed between two looks at ``stop``
DAMAGED = ("checksum mismatch", "not a whole copy")   # refusals another copy may not share


def aligned(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Each chunk's offset in a copy's data, and the data's size."""
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, end


class Piece(NamedTuple):
    """One chunk as a copy's meta records it: its place in the state (``path``, ``offsets``,
    ``shape``, ``dtype`` by name, ``global_shape``), where its bytes lie in the copy's data
    (``at``, ``nbytes``) and their ``checksum``. Stored as a JSON list in this order."""

    path: list
    offsets: list
    shape: list
    dtype: str
    global_shape: list
    at: int = 0
    nbytes: int = 0
    checksum: str = ""

    @property
    def place(self) -> tuple:
        """Where in the state it goes, and as what: what a state's chunk must match."""
        return (list(self.path), list(self.offsets), list(self.shape), self.dtype,
                list(self.global_shape))


def place(c: Chunk) -> tuple:
    """A state's chunk's :attr:`Piece.place`."""
    return (list(c.path), list(c.offsets), list(c.shape), dtype_name(c.dtype),
            list(c.global_shape))


def tail(rank: int, step: int, chunks: Sequence[Chunk], data: np.ndarray, extras: bytes,
         stop: Callable[[], bool] = lambda: False) -> bytes | None:
    """The tail of a copy whose data is ``data`` (the staged ``chunks`` live there): the
    extras, the meta with every checksum, the trailer. None when ``stop()`` turns true on
    the way (asked every BLOCK bytes: a newer snapshot waits for no more than that)."""
    algorithm = checksum.DEFAULT
    fn = checksum.get(algorithm)
    base = data.ctypes.data
    metas = []
    for c in chunks:
        piece = c.local.numpy()                     # a staged chunk: uint8, inside ``data``
        offset = piece.ctypes.data - base if piece.size else 0
        value = 0
        for at in range(0, piece.nbytes, BLOCK):
            if stop():
                return None
            value = fn(piece[at:at + BLOCK], value)
        metas.append(Piece(*place(c), offset, piece.nbytes, value))
    size = max((m.at + m.nbytes for m in metas), default=0)    # what the chunks use of data
    meta = json.dumps({"rank": rank, "step": step, "algorithm": algorithm,
                       "data_size": size, "chunks": [list(m) for m in metas],
                       "extras": [len(extras), fn(extras)]}).encode()
    return extras + meta + TRAILER.pack(len(meta), MAGIC)


def meta_of(end: bytes | np.ndarray) -> dict | None:
    """The meta a copy's ``end`` (its tail, or the whole copy) closes with, or None."""
    if len(end) < TRAILER.size:
        return None
    length, magic = TRAILER.unpack(bytes(end[-TRAILER.size:]))
    if magic != MAGIC or length > len(end) - TRAILER.size:
        return None
    try:
        meta = json.loads(bytes(end[-TRAILER.size - length:-TRAILER.size]))
    except ValueError:
        return None
    return meta if isinstance(meta, dict) and "step" in meta else None


def read_meta(path: Path) -> dict | None:
    """The meta of the copy (or tail) file ``path``, with its ``size``; None when it holds
    no whole copy."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size < TRAILER.size:
                return None
            fh.seek(size - TRAILER.size)
            length, _ = TRAILER.unpack(fh.read(TRAILER.size))
            fh.seek(max(size - TRAILER.size - length, 0))
            meta = meta_of(fh.read())
    except (OSError, ValueError, struct.error):
        return None
    return {**meta, "size": size} if meta is not None else None


def spoil(fd: int) -> None:
    """Make the copy in ``fd`` no copy (its trailer zeroed) before it is rewritten."""
    size = os.fstat(fd).st_size
    if size >= TRAILER.size:
        os.pwrite(fd, bytes(TRAILER.size), size - TRAILER.size)


@dataclass
class Decoded:
    """A verified copy, ready to go into a state: each state chunk's bytes (``into``), the
    values the state has no tensor for (``added``) and the unpickled extras."""

    into: list[tuple[Chunk, np.ndarray]]
    added: list[tuple[tuple, torch.Tensor]]
    extras: dict


def decode(data: np.ndarray, end: np.ndarray, state: dict,
           unpickle_mode: str) -> Decoded | str:
    """Verify a copy (``data``; ``end``: its tail) against its checksums and ``state``'s
    layout and decode its extras, writing nothing: a :class:`Decoded`, or why not (laid
    out otherwise, damaged, extras refused). Values the copy holds and ``state`` lacks are
    added (a fresh optimizer's moments), as a load from storage adds them; a value of
    ``state`` the copy lacks is refused."""
    meta = meta_of(end)
    if meta is None or meta.get("data_size", -1) > data.size:
        return "not a whole copy"
    fn = checksum.get(meta["algorithm"])
    pieces: dict[str, tuple[Piece, np.ndarray]] = {}
    for raw in meta["chunks"]:
        m = Piece(*raw)
        piece = data[m.at:m.at + m.nbytes]
        if piece.size != m.nbytes or fn(piece) != m.checksum:
            return f"checksum mismatch in {m.path}"
        pieces[_key(m.path, m.offsets)] = (m, piece)
    extras = end[:meta["extras"][0]]
    if fn(extras) != meta["extras"][1]:
        return "checksum mismatch in the extras"
    chunks, _ = flatten(state)
    into = []
    for c in chunks:
        m, piece = pieces.pop(_key(c.path, c.offsets), (None, None))
        if m is None or m.place != place(c):
            return f"the state is laid out otherwise (at {list(c.path)})"
        into.append((c, piece))
    if any(m.shape != m.global_shape for m, _ in pieces.values()):
        return "the state is laid out otherwise (a shard the state does not hold)"
    added = [(tuple(m.path), torch.from_numpy(piece.copy()).view(dtype_from_name(m.dtype))
              .view(m.shape)) for m, piece in pieces.values()]
    try:
        loaded: Any = unpickle.loads(extras.tobytes(), "a peer copy's extras", unpickle_mode)
    except Exception as exc:  # noqa: BLE001 - a refused class, or any unpickling failure
        return f"its extras were refused ({exc})"
    return Decoded(into, added, loaded)


def apply(decoded: Decoded, state: dict) -> None:
    """Write a :func:`decode`d copy into ``state`` (in place); nothing here can refuse
    (outside autograd: a parameter that requires grad is written like any tensor)."""
    with torch.no_grad():
        for c, piece in decoded.into:
            if c.nbytes:
                c.local.copy_(torch.from_numpy(piece).view(c.dtype).view(c.shape))
    for where, value in decoded.added:
        set_path(state, where, value)
    for where, value in decoded.extras.items():
        set_path(state, where, value)


def _key(path: Sequence, offsets: Sequence) -> str:
    return json.dumps([list(path), list(offsets)])
