"""Per-rank shard writing: who writes which chunk, staging buffers, the background writer.

Each rank writes exactly two files per step, ``rankNNNNN.bin`` (all its tensor bytes,
back to back) and ``rankNNNNN.extra.pkl`` (its extras): few large files, no metadata
storm on Lustre's MDS however many tensors the model has. A rank writes the values it
provisionally owns first, fingerprints the others (meanwhile, or while the disk flushes
those writes) and appends its per-rank values once every rank's fingerprints are compared
(:mod:`hpctrain.checkpoint.replicas`). In the usual case (every replica agrees: nothing
more to write) the disk's flush is thus not left for the end.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hpctrain.checkpoint import checksum, exchange, saveplan
from hpctrain.checkpoint.fileio import SegmentFile, write_segments
from hpctrain.checkpoint.manifest import ExtrasEntry, FileRecord, RankRecords, TensorEntry
from hpctrain.checkpoint.storage import Task
from hpctrain.checkpoint.tree import Chunk, as_bytes, dtype_name


def fingerprints(chunks: list[Chunk]) -> dict[tuple, int]:
    """The checksum of each plain chunk's bytes, by key; none for DTensor shards, whose
    placement already says whether they are replicas. The algorithm is the one the shard
    files are written with, so the checksum of a chunk a rank has written serves as its
    fingerprint."""
    fn = checksum.get(checksum.DEFAULT)
    return {c.key(): fn(segment(c)) for c in chunks if not c.sharded}


def extras_fingerprints(extras: dict) -> dict[tuple, int]:
    """Checksum of each extra's pickle, by path (to find the extras that differ by rank)."""
    fn = checksum.fast()
    return {path: fn(pickle.dumps(value, protocol=5)) for path, value in extras.items()}


def segment(c: Chunk) -> np.ndarray:
    """A chunk's bytes, as the numpy view the file writer takes."""
    return as_bytes(c.local).numpy()


@dataclass
class RankPayload:
    """What one rank persists for one step: its chunks (live tensors, or an async save's
    staged copies) and its extras, pickled."""

    chunks: list[Chunk]
    extras: bytes


class Staging:
    """Reusable host buffers for async saves and snapshots: allocated once per layout, then
    reused.

    The caller blocks only for the device->host / host->host copies into these buffers;
    with pinned memory (CUDA) the copies run at PCIe speed and overlap each other.
    ``allocate(nbytes)``, when given, provides one block for all of them (each chunk at an
    aligned offset: :func:`hpctrain.checkpoint.peerfile.aligned`): a snapshot's staging
    mapped from node memory, for peer copies.
    """

    def __init__(self, allocate: Callable[[int], torch.Tensor] | None = None) -> None:
        self._allocate = allocate
        self._signature: list[tuple] | None = None
        self._buffers: list[torch.Tensor] = []
        self._typed: list[torch.Tensor] = []   # the same memory, as each chunk's dtype/shape

    def stage(self, chunks: list[Chunk], extras: dict) -> RankPayload:
        signature = [(c.dtype, c.shape) for c in chunks]
        if signature != self._signature:
            self._buffers = self._new_buffers([c.nbytes for c in chunks])
            # the views are made once: the stall is the copies and nothing else
            self._typed = [b.view(c.dtype).view(c.shape) if c.nbytes else b
                           for b, c in zip(self._buffers, chunks)]
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
        return RankPayload(staged, pickle.dumps(extras, protocol=5))

    def _new_buffers(self, sizes: list[int]) -> list[torch.Tensor]:
        if self._allocate is None:
            pin = torch.cuda.is_available()
            return [torch.empty(n, dtype=torch.uint8, pin_memory=pin) for n in sizes]
        from hpctrain.checkpoint.peerfile import aligned

        offsets, total = aligned(sizes)
        block = self._allocate(total)
        return [block[o:o + n] for o, n in zip(offsets, sizes)]


def rank_writer(comm: Any, plans: saveplan.PlanCache, chunks: list[Chunk], extras: dict,
                staged: RankPayload | None = None, extras_fps: dict | None = None,
                failure: Exception | None = None) -> Callable[[Path], RankRecords]:
    """The function that writes this rank's files: the shared chunks it owns and its own
    per-rank values (:mod:`hpctrain.checkpoint.replicas`), with the extras that differ by
    rank marked; from ``staged`` (an async save's copy) when given, else from the live
    tensors. Collective when ``comm.active`` (here: the plan, cached in ``plans``; in the
    returned function: the fingerprints). A local ``failure`` (or one here) is raised by
    the returned function, after its collectives, so no rank is left waiting."""
    payload = staged
    if payload is None and failure is None:
        try:
            payload = RankPayload(chunks, pickle.dumps(extras, protocol=5))
        except Exception as exc:  # noqa: BLE001 - e.g. an extra that cannot be pickled
            failure = exc
    if payload is None or failure is not None:
        payload = RankPayload([], b"")
    plan = structure = None
    if comm.active:
        # provisional: every value held at the same size by several ranks is taken to be
        # shared, and its owner starts writing it while the fingerprints that confirm it
        # are computed (RankSave.write), so checksumming every plain tensor overlaps the disk
        paths = list(extras_fps if extras_fps is not None else extras)
        structure = saveplan.Structure.of(payload.chunks, paths, node_cpus())
        try:
            plan = exchange.provisional(comm, plans, structure)
        except saveplan.PlanFailed as exc:   # on every rank: none compares fingerprints
            failure = failure or exc
    rank_save = RankSave(comm, plans, plan, structure, payload, extras, extras_fps, failure)
    return rank_save.write


def node_cpus() -> tuple[str, frozenset[int]]:
    """(this host's name, the CPUs this process may run on)."""
    try:
        cpus = frozenset(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = frozenset(range(os.cpu_count() or 1))
    return socket.gethostname(), cpus


@dataclass
class RankSave:
    """One rank's part of one save, written by :meth:`write` into the step's temp dir."""

    comm: Any
    plans: saveplan.PlanCache
    plan: saveplan.RankPlan | None      # provisional; None when this process is alone
    structure: saveplan.Structure | None   # what the plan was made for (or reused on)
    payload: RankPayload
    extras: dict                        # live extras, to fingerprint (sync saves)
    extras_fps: dict | None             # or their fingerprints, taken when staged (async)
    failure: Exception | None

    def write(self, tmp_dir: Path) -> RankRecords:
        """Write this rank's files; return what they add to the manifest. Every rank
        passes its collectives (the fingerprints) whatever fails, then raises."""
        rank, plan = self.comm.rank, self.plan
        data_name = f"rank{rank:05d}.bin"
        first = [c for c in self.payload.chunks if plan is None or plan.writes(c.key())]
        out, blocks, prints, error = self._write_first(tmp_dir / data_name, first)
        try:
            settled = exchange.settle(self.comm, self.plans, plan, self.structure, prints) \
                if plan is not None else None
            if error is not None:
                raise error
            assert out is not None
            final, own_extras, more = plan, [], []
            # (a rank that failed fails the commit with its own error; the others finish)
            if plan is not None and settled is not None:
                final, own_extras = settled
                more = [c for c in self.payload.chunks if final.writes(c.key())
                        and not plan.writes(c.key())]
                blocks += out.write([segment(c) for c in more])
            size = out.close()
        except BaseException:
            if out is not None:
                out.abort()
            raise
        written = [dataclasses.replace(c, rank=rank)
                   if final is not None and c.key() in final.per_rank else c
                   for c in first + more]
        return self._records(tmp_dir, data_name, size, written, blocks, own_extras)

    def _write_first(self, path: Path, first: list[Chunk]) -> tuple:
        """Write ``first`` (what the provisional plan gives this rank) and fingerprint the
        rest; return (open file, blocks, this rank's fingerprints in its structure's order
        or None, error or None). Raises nothing: the caller must reach the collective
        either way.

        With a CPU to spare per rank the fingerprints are taken on a second thread while
        the chunks are written. Without one (4 ranks on 2 cores) that thread slows the
        writes it competes with (measured here: 0.5-0.8 s for the first writes instead of
        0.4-0.55 s), so they follow the writes, while the disk flushes what is written
        (:meth:`SegmentFile.start_sync`); a save that needs nothing more then has nothing
        left to flush when the fingerprints are compared."""
        out, blocks, plan = None, [], self.plan
        try:
            if self.failure is not None:
                raise self.failure
            rest = [] if plan is None else [c for c in self.payload.chunks
                                            if not plan.writes(c.key())]
            prints = Task(self._prints, rest) if plan is not None and plan.alongside else None
            try:
                out = SegmentFile(path)
                blocks = out.write([segment(c) for c in first])
            finally:
                taken = prints.result() if prints is not None else None
            if plan is None:
                return out, blocks, None, None
            out.start_sync()
            others, extras_fps = taken if taken is not None else self._prints(rest)
        except Exception as exc:  # noqa: BLE001 - raised by write(), after the collective
            return out, blocks, None, exc
        # a written chunk's block checksum is its fingerprint (the same algorithm)
        others.update((c.key(), crc) for c, (_off, _n, crc) in zip(first, blocks)
                      if not c.sharded)
        return out, blocks, [others[c.key()] for c in self.payload.chunks if not c.sharded] \
            + list(extras_fps.values()), None

    def _records(self, tmp_dir: Path, data_name: str, size: int, written: list[Chunk],
                 blocks: list, own_extras: list) -> RankRecords:
        """Write the extras file; return the records of both files and their entries."""
        rank, algorithm = self.comm.rank, checksum.DEFAULT
        extra_name = f"rank{rank:05d}.extra.pkl"
        tensors = [TensorEntry(path=list(c.path), dtype=dtype_name(c.dtype),
                               global_shape=list(c.global_shape), offsets=list(c.offsets),
                               shape=list(c.shape), sharded=c.sharded, file=data_name,
                               offset=off, nbytes=n, sum=total, rank=c.rank)
                   for c, (off, n, total) in zip(written, blocks)]
        esize, eblocks = write_segments(tmp_dir / extra_name, [self.payload.extras],
                                        direct=False, algorithm=algorithm)
        own = [list(path) for path in own_extras]
        return RankRecords(
            files=[FileRecord(data_name, size, blocks), FileRecord(extra_name, esize, eblocks)],
            tensors=tensors, extras=[ExtrasEntry(rank, extra_name, own)], checksum=algorithm)

    def _prints(self, rest: list[Chunk]) -> tuple[dict[tuple, int], dict]:
        """The fingerprints of the plain chunks this rank holds but does not write first,
        and of its extras."""
        efps = self.extras_fps if self.extras_fps is not None \
            else extras_fingerprints(self.extras)
        return fingerprints(rest), efps


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
