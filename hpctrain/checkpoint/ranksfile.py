"""``manifest.ranks`` (manifest format 5): every rank's record of one step, indexed so that
a rank reads its own without reading the others' (no torch).

Layout: ``HPCRANKS`` and the world size (u64); then per rank, in rank order, where its
record is (offset u64), its length (u32) and its sum (u32, the manifest's algorithm); then
the records (JSON, :class:`~hpctrain.checkpoint.manifest.RankRecords`), in rank order. A
loading rank reads 16 bytes of header, 16 of index and its record, and checks the
record's sum: a damaged index or record is found there, whatever byte it hit. The file as
a whole is also recorded in the head (its size and a sum per block), which ``hpctrain ckpt
verify`` and a whole read check.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from hpctrain.checkpoint.checksum import Checksum
from hpctrain.checkpoint.manifest import RANKS, FileRecord
from hpctrain.errors import CheckpointCorrupt

MAGIC = b"HPCRANKS"
HEAD = struct.Struct("<8sQ")        # magic, world size
ENTRY = struct.Struct("<QII")       # a record's offset, length, sum
BLOCK = 64 << 20                    # the head's record of the file: a sum per 64 MiB


def encode(records: list[bytes], fn: Checksum) -> bytes:
    """The file holding ``records`` (rank r's at index r)."""
    offset = HEAD.size + ENTRY.size * len(records)
    index = bytearray(HEAD.pack(MAGIC, len(records)))
    for data in records:
        index += ENTRY.pack(offset, len(data), fn(data))
        offset += len(data)
    return bytes(index) + b"".join(records)


def file_record(data: bytes, fn: Checksum) -> FileRecord:
    """The head's record of the file ``data`` is: its size, a sum per block."""
    blocks = [(off, len(data[off:off + BLOCK]), fn(data[off:off + BLOCK]))
              for off in range(0, len(data), BLOCK)]
    return FileRecord(RANKS, len(data), blocks)


def read_record(step_dir: Path, rank: int, world: int, fn: Checksum) -> bytes:
    """Rank ``rank``'s record, its sum checked; CheckpointCorrupt naming the file when the
    header, the index or the record is not what was written."""
    path = step_dir / RANKS
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise CheckpointCorrupt(f"cannot read {path}: {exc.strerror} (the step is "
                                "incomplete or damaged)") from None
    try:
        _check_head(path, os.pread(fd, HEAD.size, 0), world)
        entry = os.pread(fd, ENTRY.size, HEAD.size + ENTRY.size * rank)
        if len(entry) != ENTRY.size:
            raise CheckpointCorrupt(f"{path} ends in its index (rank {rank})")
        offset, length, total = ENTRY.unpack(entry)
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    return _checked(path, rank, data, length, total, fn)


def decode_all(path: Path, data: bytes, world: int, fn: Checksum) -> list[bytes]:
    """Every rank's record from the whole file ``data``, each sum checked."""
    _check_head(path, data[:HEAD.size], world)
    out = []
    for rank in range(world):
        at = HEAD.size + ENTRY.size * rank
        offset, length, total = ENTRY.unpack(data[at:at + ENTRY.size])
        out.append(_checked(path, rank, data[offset:offset + length], length, total, fn))
    return out


def _check_head(path: Path, head: bytes, world: int) -> None:
    if len(head) != HEAD.size or HEAD.unpack(head) != (MAGIC, world):
        raise CheckpointCorrupt(f"{path}: its header is not that of {world} ranks' records "
                                "(damaged, or not written by hpctrain)")


def _checked(path: Path, rank: int, data: bytes, length: int, total: int,
             fn: Checksum) -> bytes:
    if len(data) != length or fn(data) != total:
        raise CheckpointCorrupt(f"{path}: rank {rank}'s record does not match its sum "
                                "(damaged)")
    return data
