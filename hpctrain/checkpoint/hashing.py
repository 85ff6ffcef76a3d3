"""Block sums of the files a step's writer put there without hpctrain (DeepSpeed's, or any
callback's: :meth:`CheckpointManager.save_files`), for the manifest (no torch).

hpctrain's own shard files get their sums as they are written
(:mod:`hpctrain.checkpoint.fileio`); these are read back once, by rank 0, before the
commit. Reading and checking sums is :mod:`hpctrain.checkpoint.reader`'s.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.checkpoint import checksum, storage
from hpctrain.checkpoint.manifest import MANIFEST, FileRecord, RankRecords

BLOCK = 64 << 20  # one sum per 64 MiB: a damaged byte is located to within a block


def hash_files(root: Path, exclude: set[str],
               algorithm: str = checksum.DEFAULT) -> RankRecords:
    """File records (size, a sum per 64 MiB block) of every file under ``root`` but the
    manifest and ``exclude`` (names relative to ``root``)."""
    fn, out = checksum.get(algorithm), []
    for p in storage.files_under(root):
        name = p.relative_to(root).as_posix()
        if name in exclude or name == MANIFEST:
            continue
        blocks, off = [], 0
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(BLOCK):
                blocks.append((off, len(chunk), fn(chunk)))
                off += len(chunk)
        out.append(FileRecord(name, off, blocks))
    return RankRecords(files=out, checksum=algorithm)
