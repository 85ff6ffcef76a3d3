"""Load one committed step into a state tree in place, resharding where layouts differ.

Every destination tensor (plain or DTensor shard) is a box of a global tensor; every
saved chunk is another box. A chunk saved with the same box is read straight into the
destination's memory (no extra copy); otherwise each overlapping saved chunk is read
once and the intersection copied. Reads go in file order (sequential I/O) and each
chunk's checksum (the manifest's algorithm) is computed on a second thread while the
next read is in flight.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.checkpoint import checksum, unpickle
from hpctrain.checkpoint.fileio import read_into
from hpctrain.checkpoint.hashing import check_sizes
from hpctrain.checkpoint.manifest import Manifest
from hpctrain.checkpoint.replicas import overlaps
from hpctrain.checkpoint.tree import Chunk, dtype_from_name, flatten, set_path
from hpctrain.errors import CheckpointCorrupt, CheckpointError


def _overlap(e: dict, c: Chunk) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    src, dst = [], []
    for eo, es, co, cs in zip(e["offsets"], e["shape"], c.offsets, c.shape):
        lo, hi = max(eo, co), min(eo + es, co + cs)
        if lo >= hi:
            return None
        src.append(slice(lo - eo, hi - eo))
        dst.append(slice(lo - co, hi - co))
    return tuple(src), tuple(dst)


def _direct_view(c: Chunk, e: dict) -> np.ndarray | None:
    """The destination's own bytes when the saved chunk can be read straight into them."""
    t = c.local
    if (list(c.offsets) != e["offsets"] or list(c.shape) != e["shape"] or t.device.type != "cpu"
            or not t.is_contiguous() or t.dtype != dtype_from_name(e["dtype"]) or not t.numel()):
        return None
    return t.detach().reshape(-1).view(torch.uint8).numpy()


class _Verifier:
    """The checksum of every piece on a second thread, in read order, while the next piece
    is read.

    The checksums release the GIL, so reading (a syscall copying from the page cache) and
    checksumming run on two cores at once; mismatches are collected and raised by
    :meth:`finish`, before any extra is set.
    """

    def __init__(self, step_dir: Path, algorithm: str) -> None:
        self.step_dir = step_dir
        self.fn = checksum.get(algorithm)
        self.queue: queue.Queue = queue.Queue(maxsize=8)  # bounds the lag to 64 MiB
        self.bad: list[dict] = []
        self.thread = threading.Thread(target=self._run, name="hpctrain-verify", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        value = 0
        while (item := self.queue.get()) is not None:
            e, piece, last = item
            value = self.fn(piece, value)
            if last:
                if value != e["crc32"]:
                    self.bad.append(e)
                value = 0

    def add(self, e: dict, piece: np.ndarray, last: bool) -> None:
        self.queue.put((e, piece, last))

    def finish(self) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.bad:
            e = self.bad[0]
            raise CheckpointCorrupt(f"{self.step_dir / e['file']}: checksum mismatch in bytes "
                                    f"[{e['offset']}, {e['offset'] + e['nbytes']}) (tensor "
                                    f"{e['path']}); {len(self.bad)} damaged tensor(s)")


class _Reader:
    """Sequential chunk reads in 8 MiB pieces, each handed to the verifier thread."""

    PIECE = 8 << 20

    def __init__(self, step_dir: Path, verify: bool, algorithm: str) -> None:
        self.step_dir = step_dir
        self.fds: dict[str, int] = {}
        self.verifier = _Verifier(step_dir, algorithm) if verify else None

    def _fd(self, name: str) -> int:
        if name not in self.fds:
            fd = self.fds[name] = os.open(self.step_dir / name, os.O_RDONLY)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # larger readahead
        return self.fds[name]

    def read(self, e: dict, dest: np.ndarray) -> None:
        name, fd = e["file"], self._fd(e["file"])
        pos, off = 0, e["offset"]
        try:
            while True:
                piece = dest[pos:pos + self.PIECE]
                read_into(fd, off + pos, piece)
                pos += piece.nbytes
                if self.verifier:
                    self.verifier.add(e, piece, pos >= dest.nbytes)
                if pos >= dest.nbytes:
                    break
        except (OSError, EOFError) as exc:
            raise CheckpointCorrupt(f"{self.step_dir / name}: cannot read tensor "
                                    f"{e['path']} ({exc})") from None

    def close(self, ok: bool) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        if self.verifier:
            verifier, self.verifier = self.verifier, None
            if ok:
                verifier.finish()
            else:
                verifier.queue.put(None)


def _per_rank_error(manifest: Manifest, what: str, rank: int) -> CheckpointError:
    return CheckpointError(
        f"step {manifest.step} holds a different {what} for each of the {manifest.world_size} "
        f"ranks that saved it, and none for rank {rank}: resume with {manifest.world_size} "
        f"ranks, or leave {what} out of the state you load (and set it afresh)")


def _by_path(manifest: Manifest, rank: int) -> tuple[dict[tuple, list[dict]], set[tuple]]:
    """The saved entries a rank may load, by path: the shared ones, and its own where each
    rank saved its own value; plus the per-rank paths it has no value for."""
    shared: dict[tuple, list[dict]] = {}
    own: dict[tuple, list[dict]] = {}
    per_rank: set[tuple] = set()
    for e in manifest.tensors:
        path = tuple(e["path"])
        if "rank" not in e:
            shared.setdefault(path, []).append(e)
            continue
        per_rank.add(path)
        if e["rank"] == rank:
            own.setdefault(path, []).append(e)
    return {**shared, **own}, per_rank - set(own)


def _plan(manifest: Manifest, chunks: list[Chunk], rank: int) -> tuple[list, dict]:
    by_path, unowned = _by_path(manifest, rank)
    ops: list[tuple[dict, Chunk, Any]] = []
    for c in chunks:
        entries = by_path.get(c.path)
        if not entries and c.path in unowned:
            raise _per_rank_error(manifest, f"tensor {list(c.path)}", rank)
        if not entries:
            raise CheckpointError(f"step {manifest.step} has no tensor at {list(c.path)}: "
                                  "load into a state with the same keys as the saved one")
        if entries[0]["global_shape"] != list(c.global_shape):
            raise CheckpointError(f"tensor at {list(c.path)} was saved with shape "
                                  f"{entries[0]['global_shape']}, the state has "
                                  f"{list(c.global_shape)}: build the same model before loading")
        exact = [e for e in entries if _direct_view(c, e) is not None]
        if exact:
            ops.append((exact[0], c, "direct"))
            continue
        for e in entries:
            region = _overlap(e, c)
            if region is not None:
                ops.append((e, c, region))
    known = {c.path for c in chunks}
    return ops, {p: es for p, es in by_path.items() if p not in known}


def _new_chunks(missing: dict[tuple, list[dict]]) -> list[Chunk]:
    """Whole plain tensors for saved paths the state lacks (e.g. loading into ``{}``)."""
    out = []
    for path, entries in missing.items():
        shape = tuple(entries[0]["global_shape"])
        t = torch.empty(shape, dtype=dtype_from_name(entries[0]["dtype"]))
        out.append(Chunk(path, t, t.dtype, shape, (0,) * len(shape), shape, False))
    return out


def load_step(step_dir: Path, manifest: Manifest, state: dict, rank: int,
              verify: bool = True, unpickle_mode: str = "safe") -> None:
    """Load ``step_dir`` into ``state`` in place. CheckpointCorrupt if verification fails;
    CheckpointError if the extras hold a global the unpickler (``unpickle_mode``) refuses."""
    if verify:
        problem = check_sizes(step_dir, manifest)
        if problem:
            raise CheckpointCorrupt(problem)
    chunks, wanted = flatten(state)
    ops, missing = _plan(manifest, chunks, rank)
    # decided before anything is read: a refused load leaves the state as it was
    extras_file, not_mine = _extras_source(manifest, rank, [c.path for c in chunks] + list(wanted))
    fresh = _new_chunks(missing)
    for c in fresh:
        ops += [(e, c, _overlap(e, c)) for e in missing[c.path]]
    ops.sort(key=lambda op: (op[0]["file"], op[0]["offset"]))
    # the extras first: a refused pickle must not leave the tensors half overwritten
    extras = {} if extras_file is None else {
        p: v for p, v in _read_extras(step_dir, manifest, extras_file, rank, verify,
                                      unpickle_mode).items()
        if not any(overlaps(p, o) for o in not_mine)}
    reader, staged = _Reader(step_dir, verify, manifest.checksum), {}
    try:
        _run_ops(reader, ops, staged)
    except BaseException:
        reader.close(ok=False)
        raise
    reader.close(ok=True)  # raises CheckpointCorrupt on a checksum mismatch
    for c in fresh:
        set_path(state, c.path, c.local)
    for path, value in extras.items():
        set_path(state, path, value)


def _run_ops(reader: _Reader, ops: list, staged: dict) -> None:
    for e, c, how in ops:
        if how == "direct":
            reader.read(e, _direct_view(c, e))
            continue
        key = (e["file"], e["offset"])
        if key not in staged:  # read each saved chunk once, however many boxes it feeds
            buf = torch.empty(e["nbytes"], dtype=torch.uint8)
            reader.read(e, buf.numpy())
            staged = {key: buf.view(dtype_from_name(e["dtype"])).view(e["shape"])}
        src, dst = how
        with torch.no_grad():
            c.local[dst].copy_(staged[key][src])


def _extras_source(manifest: Manifest, rank: int,
                   wanted: list[tuple]) -> tuple[str | None, set[tuple]]:
    """(the extras file this rank reads, the paths in it that are not this rank's): its
    own file; a rank the step has none for (the world grew) reads rank 0's without the
    extras that differ by rank, and gets an error if the state asks for one of those."""
    by_rank = {e["rank"]: e["file"] for e in manifest.extras}
    if rank in by_rank:
        return by_rank[rank], set()
    own = {tuple(p) for e in manifest.extras for p in e.get("own", [])}
    asked = [p for p in sorted(own, key=repr) if any(overlaps(p, w) for w in wanted)]
    if asked:
        raise _per_rank_error(manifest, f"extra {list(asked[0])}", rank)
    return by_rank.get(0), own


def _read_extras(step_dir: Path, manifest: Manifest, name: str, rank: int,
                 verify: bool, unpickle_mode: str) -> dict:
    data = (step_dir / name).read_bytes()
    if verify:
        rec, fn = manifest.file(name), checksum.get(manifest.checksum)
        pos = 0
        for off, length, crc in rec.blocks:
            if fn(data[off:off + length]) != crc or len(data) < off + length:
                raise CheckpointCorrupt(f"{step_dir / name}: checksum mismatch in bytes "
                                        f"[{off}, {off + length}) (extras of rank {rank})")
            pos = off + length
        if pos != len(data):
            raise CheckpointCorrupt(f"{step_dir / name} has {len(data)} bytes, manifest "
                                    f"says {pos}")
    return unpickle.loads(data, str(step_dir / name), unpickle_mode)
