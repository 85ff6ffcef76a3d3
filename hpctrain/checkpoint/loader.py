"""Load one committed step into a state tree in place, resharding where layouts differ.

Every destination tensor (plain or DTensor shard) is a box of a global tensor; every
saved chunk is another box. A chunk saved with the same box is read straight into the
destination's memory (no extra copy); otherwise each overlapping saved chunk is read
once and the intersection copied. Reads go in file order (sequential I/O) through
:class:`~hpctrain.checkpoint.reader.StepReader`, which checks each chunk's sum on a
second thread while the next read is in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.checkpoint import unpickle
from hpctrain.checkpoint.fit import Fit, Misfit, unfilled, unplaced
from hpctrain.checkpoint.manifest import Manifest, TensorEntry
from hpctrain.checkpoint.reader import StepReader
from hpctrain.checkpoint.replicas import overlaps
from hpctrain.checkpoint.tree import Chunk, dtype_from_name, flatten, has_room, set_path
from hpctrain.errors import CheckpointCorrupt, CheckpointError


def _overlap(e: TensorEntry, c: Chunk) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    src, dst = [], []
    for eo, es, co, cs in zip(e.offsets, e.shape, c.offsets, c.shape):
        lo, hi = max(eo, co), min(eo + es, co + cs)
        if lo >= hi:
            return None
        src.append(slice(lo - eo, hi - eo))
        dst.append(slice(lo - co, hi - co))
    return tuple(src), tuple(dst)


def _direct_view(c: Chunk, e: TensorEntry) -> np.ndarray | None:
    """The destination's own bytes when the saved chunk can be read straight into them."""
    t = c.local
    if (list(c.offsets) != e.offsets or list(c.shape) != e.shape or t.device.type != "cpu"
            or not t.is_contiguous() or t.dtype != dtype_from_name(e.dtype) or not t.numel()):
        return None
    return t.detach().reshape(-1).view(torch.uint8).numpy()


def _per_rank_error(manifest: Manifest, what: str, rank: int) -> CheckpointError:
    return CheckpointError(
        f"step {manifest.step} holds a different {what} for each of the {manifest.world_size} "
        f"ranks that saved it, and none for rank {rank}: resume with {manifest.world_size} "
        f"ranks, or leave {what} out of the state you load (and set it afresh)")


def _by_path(manifest: Manifest,
             rank: int) -> tuple[dict[tuple, list[TensorEntry]], set[tuple]]:
    """The saved entries a rank may load, by path: the shared ones, and its own where each
    rank saved its own value; plus the per-rank paths it has no value for."""
    shared: dict[tuple, list[TensorEntry]] = {}
    own: dict[tuple, list[TensorEntry]] = {}
    for e in manifest.tensors:
        if e.rank is None:
            shared.setdefault(tuple(e.path), []).append(e)
        elif e.rank == rank:
            own.setdefault(tuple(e.path), []).append(e)
    return {**shared, **own}, {tuple(p) for p in manifest.per_rank} - set(own)


def _plan(manifest: Manifest, state: dict, chunks: list[Chunk],
          rank: int) -> tuple[list, dict]:
    by_path, unowned = _by_path(manifest, rank)
    ops: list[tuple[TensorEntry, Chunk, Any]] = []
    for c in chunks:
        entries = by_path.get(c.path)
        if not entries and c.path in unowned:
            raise _per_rank_error(manifest, f"tensor {list(c.path)}", rank)
        if not entries:
            raise CheckpointError(f"step {manifest.step} has no tensor at {list(c.path)}: "
                                  "load into a state with the same keys as the saved one")
        if entries[0].global_shape != list(c.global_shape):
            raise CheckpointError(f"tensor at {list(c.path)} was saved with shape "
                                  f"{entries[0].global_shape}, the state has "
                                  f"{list(c.global_shape)}: build the same model before loading")
        exact = [e for e in entries if _direct_view(c, e) is not None]
        if exact:
            ops.append((exact[0], c, "direct"))
            continue
        for e in entries:
            region = _overlap(e, c)
            if region is not None:
                ops.append((e, c, region))
    # saved tensors the state lacks: added where it leaves their place open (a top-level
    # entry, {}, a fresh optimizer's state), not inside a part it holds (a pipeline
    # stage's model: the other stages' tensors are theirs, the whole model fits no rank)
    known = {c.path for c in chunks}
    return ops, {p: es for p, es in by_path.items() if p not in known and has_room(state, p)}


def _new_chunks(missing: dict[tuple, list[TensorEntry]]) -> list[Chunk]:
    """Whole plain tensors for saved paths the state has room for (e.g. loading into
    ``{}``)."""
    out = []
    for path, entries in missing.items():
        shape = tuple(entries[0].global_shape)
        t = torch.empty(shape, dtype=dtype_from_name(entries[0].dtype))
        out.append(Chunk(path, t, t.dtype, shape, (0,) * len(shape), shape, False))
    return out


def load_step(step_dir: Path, manifest: Manifest, state: dict, rank: int,
              verify: bool = True, unpickle_mode: str = "safe",
              fit: Fit | None = None, ready: Callable[[], None] | None = None) -> Misfit:
    """Load ``step_dir`` into ``state`` in place. CheckpointCorrupt if verification fails;
    CheckpointError if the extras hold a global the unpickler (``unpickle_mode``) refuses.
    Returns what did not fit (saved tensors the state has no place for, values of the
    state the step lacks) for the job log; ``fit`` refuses either with CheckpointError
    before anything is written (:mod:`hpctrain.checkpoint.fit`). ``ready()`` is called
    once the checks that come before the first write have passed (the ranks' agreement:
    it raises for another rank's refusal, and nothing is written)."""
    reader = StepReader(step_dir, manifest, verify)
    ops, fresh, extras_file, not_mine = prepare(reader, state, rank)
    saved = _by_path(manifest, rank)[0]
    misfit = Misfit(manifest.step, fit or Fit(), unplaced(state, saved))
    misfit.refuse_unexpected()
    with reader:
        # the extras first: a refused pickle must not leave the tensors half overwritten
        extras = {} if extras_file is None else _read_extras(reader, extras_file, rank,
                                                             not_mine, unpickle_mode)
        misfit.missing = unfilled(state, [*saved, *extras])
        misfit.refuse_missing()   # (nor a refused misfit)
        if ready is not None:
            ready()
        _run_ops(reader, ops)
        reader.check()  # CheckpointCorrupt on a checksum mismatch, before anything is set
    for c in fresh:
        set_path(state, c.path, c.local)
    for path, value in extras.items():
        set_path(state, path, value)
    return misfit


def prepare(reader: StepReader, state: dict,
            rank: int) -> tuple[list, list[Chunk], str | None, set[tuple]]:
    """Everything a load decides before it reads a byte, so that a refused load leaves the
    state as it was: (the reads, in file order; the tensors made for saved paths the state
    lacks and has room for (:func:`~hpctrain.checkpoint.tree.has_room`); the extras file to
    read; the paths in it that are not this rank's). With
    ``reader.verify``, CheckpointCorrupt when a file it reads is missing or short (only
    those: a rank stats its own files and the owners' of what it reads, not every rank's)."""
    manifest = reader.manifest
    chunks, wanted = flatten(state)
    ops, missing = _plan(manifest, state, chunks, rank)
    extras_file, not_mine = _extras_source(manifest, rank, [c.path for c in chunks] + list(wanted))
    fresh = _new_chunks(missing)
    for c in fresh:   # (an empty shard, e.g. 4 columns over 3 ranks, overlaps nothing)
        ops += [(e, c, box) for e in missing[c.path] if (box := _overlap(e, c)) is not None]
    ops.sort(key=lambda op: (op[0].file, op[0].offset))
    if reader.verify:
        ends = {} if extras_file is None else {extras_file: 0}
        for e, _c, _how in ops:
            ends[e.file] = max(ends.get(e.file, 0), e.offset + e.nbytes)
        problem = reader.check_files(ends)
        if problem:
            raise CheckpointCorrupt(problem)
    return ops, fresh, extras_file, not_mine


def _run_ops(reader: StepReader, ops: list) -> None:
    staged: dict = {}
    for e, c, how in ops:
        if how == "direct":
            reader.read(e, _direct_view(c, e))
            continue
        key = (e.file, e.offset)
        if key not in staged:  # read each saved chunk once, however many boxes it feeds
            buf = torch.empty(e.nbytes, dtype=torch.uint8)
            reader.read(e, buf.numpy())
            staged = {key: buf.view(dtype_from_name(e.dtype)).view(e.shape)}
        src, dst = how
        with torch.no_grad():
            c.local[dst].copy_(staged[key][src])


def _extras_source(manifest: Manifest, rank: int,
                   wanted: list[tuple]) -> tuple[str | None, set[tuple]]:
    """(the extras file this rank reads, the paths in it that are not this rank's): its
    own file; a rank the step has none for (the world grew) reads rank 0's without the
    extras that differ by rank, and gets an error if the state asks for one of those."""
    by_rank = {e.rank: e.file for e in manifest.extras}
    if rank in by_rank:
        return by_rank[rank], set()
    own = {tuple(p) for p in manifest.own}
    asked = [p for p in sorted(own, key=repr) if any(overlaps(p, w) for w in wanted)]
    if asked:
        raise _per_rank_error(manifest, f"extra {list(asked[0])}", rank)
    return by_rank.get(0), own


def _read_extras(reader: StepReader, name: str, rank: int, not_mine: set[tuple],
                 unpickle_mode: str) -> dict:
    """The extras in file ``name`` (checked, then unpickled), but those in ``not_mine``."""
    data = reader.read_file(name, f"extras of rank {rank}")
    extras = unpickle.loads(data, str(reader.step_dir / name), unpickle_mode)
    return {p: v for p, v in extras.items() if not any(overlaps(p, o) for o in not_mine)}
