"""Per-rank shard writing: who writes which chunk, staging buffers, the background writer.

Each rank writes exactly two files per step, ``rankNNNNN.bin`` (all its tensor bytes,
back to back) and ``rankNNNNN.extra.pkl`` (its extras): few large files, no metadata
storm on Lustre's MDS however many tensors the model has.
"""

from __future__ import annotations

import dataclasses
import pickle
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hpctrain.checkpoint import checksum, replicas
from hpctrain.checkpoint.fileio import write_segments
from hpctrain.checkpoint.manifest import FileRecord
from hpctrain.checkpoint.storage import Task
from hpctrain.checkpoint.tree import Chunk, as_bytes, dtype_name


def fingerprints(chunks: list[Chunk]) -> list[tuple[tuple, int, int | None]]:
    """(key, nbytes, checksum of the bytes) per chunk, for :func:`replicas.plan_writes`; none
    for DTensor shards, whose placement already says whether they are replicas. The
    fastest checksum here (every rank hashes every plain tensor it holds)."""
    fn, out = checksum.fast(), []
    for c in chunks:
        crc = None if c.sharded else fn(as_bytes(c.local).numpy())
        out.append((c.key(), c.nbytes, crc))
    return out


def extras_fingerprints(extras: dict) -> dict[tuple, int]:
    """Checksum of each extra's pickle, by path (to find the extras that differ by rank)."""
    fn = checksum.fast()
    return {path: fn(pickle.dumps(value, protocol=5)) for path, value in extras.items()}


def mine(chunks: list[Chunk], plan: replicas.WritePlan, rank: int) -> list[Chunk]:
    """The chunks ``rank`` writes: shared ones it owns, and its own per-rank values."""
    return [dataclasses.replace(c, rank=rank) if c.key() in plan.per_rank else c
            for c in chunks if plan.writes(rank, c.key())]


@dataclass
class RankPayload:
    """What one rank persists for one step: chunk metadata + byte segments + extras."""

    chunks: list[Chunk]
    segments: list[np.ndarray]
    extras: bytes
    keepalive: list[Any] = field(default_factory=list)  # tensors the segments point into

    def only(self, chunks: list[Chunk]) -> RankPayload:
        """This payload cut to ``chunks`` (some of its own, staged: host byte buffers)."""
        views = [as_bytes(c.local) for c in chunks]
        return RankPayload(chunks, [v.numpy() for v in views], self.extras, keepalive=views)


def payload_direct(chunks: list[Chunk], extras: dict) -> RankPayload:
    """Sync save: segments are views of the live tensors (no staging copy)."""
    views = [as_bytes(c.local) for c in chunks]
    return RankPayload(chunks, [v.numpy() for v in views], pickle.dumps(extras, protocol=5),
                       keepalive=views)


class Staging:
    """Reusable host buffers for async saves: allocated once per layout, then reused.

    The caller blocks only for the device->host / host->host copies into these buffers;
    with pinned memory (CUDA) the copies run at PCIe speed and overlap each other.
    """

    def __init__(self) -> None:
        self._signature: list[tuple] | None = None
        self._buffers: list[torch.Tensor] = []
        self._typed: list[torch.Tensor] = []   # the same memory, as each chunk's dtype/shape
        self._arrays: list[np.ndarray] = []    # and as numpy bytes, for the writer

    def stage(self, chunks: list[Chunk], extras: dict) -> RankPayload:
        signature = [(c.dtype, c.shape) for c in chunks]
        if signature != self._signature:
            pin = torch.cuda.is_available()
            self._buffers = [torch.empty(c.nbytes, dtype=torch.uint8, pin_memory=pin)
                             for c in chunks]
            # the views are made once: the stall is the copies and nothing else
            self._typed = [b.view(c.dtype).view(c.shape) if c.nbytes else b
                           for b, c in zip(self._buffers, chunks)]
            self._arrays = [b.numpy() for b in self._buffers]
            self._signature = signature
        cuda = False
        for typed, c in zip(self._typed, chunks):
            if c.nbytes:
                typed.copy_(c.local, non_blocking=True)
                cuda = cuda or c.local.is_cuda
        if cuda:
            torch.cuda.synchronize()
        staged = [dataclasses.replace(c, local=buf) for buf, c in zip(self._buffers, chunks)]
        # extras are pickled now: the caller may mutate them as soon as save() returns
        return RankPayload(staged, list(self._arrays), pickle.dumps(extras, protocol=5))


def rank_writer(comm: Any, chunks: list[Chunk], extras: dict,
                staged: RankPayload | None = None, extras_fps: dict | None = None,
                failure: Exception | None = None) -> Callable[[Path], tuple]:
    """The function that writes this rank's files: the shared chunks it owns and its own
    per-rank values (:mod:`hpctrain.checkpoint.replicas`), with the extras that differ by
    rank marked; from ``staged`` (an async save's copy) when given, else from the live
    tensors. Collective when ``comm.active``; a local ``failure`` (or one here) is raised by
    the returned function, after the collectives, so no rank is left waiting."""
    own_extras: list = []
    if comm.active:
        local: tuple = ([], {})
        if failure is None:
            try:
                local = (fingerprints(chunks), extras_fingerprints(extras)
                         if extras_fps is None else extras_fps)
            except Exception as exc:  # noqa: BLE001 - e.g. an extra that cannot be pickled
                failure = exc
        gathered = comm.all_gather(local)
        plan = replicas.plan_writes([tensors for tensors, _ in gathered])
        chunks = mine(chunks, plan, comm.rank)
        own_extras = replicas.differing([e for _, e in gathered])
    try:
        if failure is not None:
            raise failure
        payload = payload_direct(chunks, extras) if staged is None else staged.only(chunks)
    except Exception as exc:  # noqa: BLE001 - re-raised on every rank by the commit
        error = exc

        def fail(tmp: Path) -> tuple:
            raise error
        return fail
    rank = comm.rank
    return lambda tmp: write_payload(tmp, rank, payload, own_extras)


def write_payload(tmp_dir: Path, rank: int, payload: RankPayload, own_extras: list = ()
                  ) -> tuple[list[dict], list[dict], list[dict]]:
    """Write one rank's files into ``tmp_dir``; return (file records, tensors, extras).
    ``own_extras``: paths of extras that differ by rank (never handed to another rank).
    Each file record names the checksum it was written with (the ranks must agree)."""
    data_name, extra_name = f"rank{rank:05d}.bin", f"rank{rank:05d}.extra.pkl"
    algorithm = checksum.DEFAULT
    size, blocks = write_segments(tmp_dir / data_name, payload.segments, algorithm=algorithm)
    tensors = [{"path": list(c.path), "dtype": dtype_name(c.dtype),
                "global_shape": list(c.global_shape), "offsets": list(c.offsets),
                "shape": list(c.shape), "sharded": c.sharded, "file": data_name,
                "offset": off, "nbytes": n, "crc32": crc,
                **({} if c.rank is None else {"rank": c.rank})}
               for c, (off, n, crc) in zip(payload.chunks, blocks)]
    esize, eblocks = write_segments(tmp_dir / extra_name, [payload.extras], direct=False,
                                    algorithm=algorithm)
    files = [{**FileRecord(data_name, size, blocks).to_json(), "checksum": algorithm},
             {**FileRecord(extra_name, esize, eblocks).to_json(), "checksum": algorithm}]
    entry: dict = {"rank": rank, "file": extra_name}
    if own_extras:
        entry["own"] = [list(path) for path in own_extras]
    return files, tensors, [entry]


class Background:
    """One worker thread; at most one save in flight; its failure is kept until collected."""

    def __init__(self) -> None:
        self._future: Task | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any]) -> None:
        """Start ``fn`` on a non-daemon thread: interpreter exit waits for it to finish."""
        with self._lock:
            self._future = Task(fn, name="hpctrain-ckpt-writer")

    def collect(self) -> None:
        """Block until the in-flight job is done; re-raise its exception once."""
        with self._lock:
            fut, self._future = self._future, None
        if fut is not None:
            fut.result()
