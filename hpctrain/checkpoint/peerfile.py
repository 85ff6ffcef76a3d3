"""One peer copy of a snapshot, as it lies in node memory (:mod:`hpctrain.checkpoint.peers`).

A copy is the snapshot's bytes (*data*: each chunk at a 64-byte aligned offset, as the
snapshot's staging lays them out) followed by its *tail*: the pickled extras, a JSON meta
(step, rank, each chunk's place in the state, offset, size and checksum, the extras'
checksum; the durable format's algorithm) and a 16-byte trailer (the meta's length and a
magic). A rank's own copy is two files (its data is the snapshot's staging memory itself,
mapped from node memory: ``R.data``; ``R.meta`` its tail); a copy kept for a ward is one
file, data then tail, in one of two slots (``W.a.copy``, ``W.b.copy``) so that the copy
arriving never destroys the last whole one. A copy is spoiled (trailer zeroed, or its tail
removed) before it is rewritten: a reader never takes half of one for a copy, and the
checksums catch anything torn.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.checkpoint import checksum, unpickle
from hpctrain.checkpoint.tree import Chunk, dtype_from_name, dtype_name, flatten, set_path

MAGIC = b"HPCTPEER"
TRAILER = struct.Struct("<Q8s")       # the meta's length, MAGIC: a copy's last 16 bytes
ALIGN = 64                            # a chunk's offset in the data (its dtype view needs it)


def aligned(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Each chunk's offset in a copy's data, and the data's size."""
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, end


def layout(c: Chunk) -> list:
    """A chunk's place in the state, as a copy's meta records it (JSON)."""
    return [list(c.path), list(c.offsets), list(c.shape), dtype_name(c.dtype),
            list(c.global_shape)]


def tail(rank: int, step: int, chunks: Sequence[Chunk], data: np.ndarray,
         extras: bytes) -> bytes:
    """The tail of a copy whose data is ``data`` (the staged ``chunks`` live there): the
    extras, the meta with every checksum, the trailer."""
    algorithm = checksum.DEFAULT
    fn = checksum.get(algorithm)
    base = data.ctypes.data
    metas = []
    for c in chunks:
        piece = c.local.numpy()                     # a staged chunk: uint8, inside ``data``
        offset = piece.ctypes.data - base if piece.size else 0
        metas.append([*layout(c), offset, piece.nbytes, fn(piece)])
    size = max((m[5] + m[6] for m in metas), default=0)    # what the chunks use of data
    meta = json.dumps({"rank": rank, "step": step, "algorithm": algorithm,
                       "data_size": size, "chunks": metas,
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


def restore(data: np.ndarray, end: np.ndarray, state: dict, unpickle_mode: str) -> str:
    """Verify a copy (``data``; ``end``: its tail) and copy it into ``state`` in place; ""
    when done, else why not (``state`` untouched: laid out otherwise, or damaged). Values
    the copy holds and ``state`` lacks are added (a fresh optimizer's moments), as a load
    from storage adds them; a value of ``state`` the copy lacks is refused."""
    meta = meta_of(end)
    if meta is None or meta.get("data_size", -1) > data.size:
        return "not a whole copy"
    fn = checksum.get(meta["algorithm"])
    pieces: dict[str, tuple[list, np.ndarray]] = {}
    for m in meta["chunks"]:
        piece = data[m[5]:m[5] + m[6]]
        if piece.size != m[6] or fn(piece) != m[7]:
            return f"checksum mismatch in {m[0]}"
        pieces[_key(m[0], m[1])] = (m, piece)
    extras = end[:meta["extras"][0]]
    if fn(extras) != meta["extras"][1]:
        return "checksum mismatch in the extras"
    chunks, _ = flatten(state)
    if any(pieces.get(_key(*layout(c)[:2]), ([],))[0][:5] != layout(c) for c in chunks):
        return "the state is laid out otherwise"
    for c in chunks:
        _, piece = pieces.pop(_key(*layout(c)[:2]))
        if c.nbytes:
            c.local.copy_(torch.from_numpy(piece).view(c.dtype).view(c.shape))
    if any(m[2] != m[4] for m, _ in pieces.values()):
        return "the state is laid out otherwise (a shard the state does not hold)"
    for m, piece in pieces.values():
        value = torch.from_numpy(piece.copy()).view(dtype_from_name(m[3])).view(m[2])
        set_path(state, tuple(m[0]), value)
    loaded: Any = unpickle.loads(extras.tobytes(), "a peer copy's extras", unpickle_mode)
    for where, value in loaded.items():
        set_path(state, where, value)
    return ""


def _key(path: list, offsets: list) -> str:
    return json.dumps([list(path), list(offsets)])
