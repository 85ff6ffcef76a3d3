"""State trees: split a nested dict into tensor chunks and picklable extras, and back.

Only dicts are descended into. Each tensor leaf becomes a :class:`Chunk`: for a
DTensor its local shard with its global offsets (so a load can reshard), for a plain
tensor the whole tensor (shared by the ranks that hold it only when they hold the same
bytes: :mod:`hpctrain.checkpoint.replicas`). Every other leaf (numbers, strings, lists,
Python RNG states, data-loader positions) is an *extra*, pickled per rank.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from hpctrain.errors import CheckpointError

Path_ = tuple  # a key path: str/int keys, JSON-representable


@dataclass
class Chunk:
    """One tensor (or local shard of a DTensor) at ``path`` covering a box of the global tensor."""

    path: Path_
    local: torch.Tensor        # the data this process holds (any device)
    dtype: torch.dtype
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    sharded: bool
    rank: int | None = None    # set when this rank's value differs from the others' (per rank)

    @property
    def nbytes(self) -> int:
        n = self.local.element_size()
        for s in self.shape:
            n *= s
        return n

    def key(self) -> tuple:
        return (self.path, self.offsets)


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return None
    return DTensor


@functools.lru_cache(maxsize=4096)
def _local_box(shape: tuple, mesh: Any, placements: tuple) -> tuple[tuple, tuple]:
    """This rank's (local shape, global offsets) of a DTensor. Cached: torch computes it
    in Python (~0.2 ms a tensor), and an async save's stall pays it for every tensor of
    the state each time, while a model's shapes and placements never change."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape_, offsets = compute_local_shape_and_global_offset(shape, mesh, placements)
    return tuple(shape_), tuple(offsets)


def _chunk(path: Path_, value: torch.Tensor, dtensor: type | None) -> Chunk:
    if dtensor is not None and isinstance(value, dtensor):
        from torch.distributed.tensor.placement_types import Partial

        if any(isinstance(p, Partial) for p in value.placements):
            raise CheckpointError(f"tensor at {list(path)} has a Partial placement: call "
                                  ".redistribute() to Shard/Replicate before saving")
        shape, offsets = _local_box(tuple(value.shape), value.device_mesh,
                                    tuple(value.placements))
        # the local shard itself: to_local() returns the same memory through an autograd
        # Function (~0.1 ms a tensor, paid for every tensor in an async save's stall)
        local = getattr(value, "_local_tensor", None)
        if not isinstance(local, torch.Tensor):
            local = value.to_local()
        return Chunk(path, local, value.dtype, tuple(value.shape), tuple(offsets),
                     tuple(shape), True)
    shape = tuple(value.shape)
    return Chunk(path, value, value.dtype, shape, (0,) * len(shape), shape, False)


def flatten(state: dict) -> tuple[list[Chunk], dict[Path_, Any]]:
    """Tensor chunks and extras of ``state``, in a deterministic order."""
    if not isinstance(state, dict):
        raise CheckpointError(f"state must be a dict (got {type(state).__name__}): pass e.g. "
                              "{'model': model.state_dict(), 'optim': optim.state_dict()}")
    dtensor = _dtensor_type()
    chunks, extras = [], {}
    for path, value in _walk(state, ()):
        if isinstance(value, torch.Tensor):
            chunks.append(_chunk(path, value, dtensor))
        else:
            extras[path] = value
    return chunks, extras


def _walk(node: dict, prefix: Path_) -> Iterator[tuple[Path_, Any]]:
    for key, value in node.items():
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            raise CheckpointError(f"state key {key!r} at {list(prefix)} is a "
                                  f"{type(key).__name__}: use str or int keys")
        path = prefix + (key,)
        if isinstance(value, dict) and value:
            yield from _walk(value, path)
        else:
            yield path, value


def set_path(state: dict, path: Path_, value: Any) -> None:
    """``state[p0][p1]... = value``, creating missing dicts on the way."""
    node = state
    for key in path[:-1]:
        nxt = node.get(key)
        if not isinstance(nxt, dict):
            nxt = node[key] = {}
        node = nxt
    node[path[-1]] = value


def has_room(state: dict, path: Path_) -> bool:
    """May a saved tensor at ``path``, which ``state`` holds no tensor at, be set there? Yes
    where the state leaves its place open: a top-level entry it does not have (``"rng"``),
    a key under an empty dict (``{}``, a fresh optimizer's ``state``), a value that is no
    tensor (replaced, as a load always did). No for a key missing inside a part the state
    does hold (its ``"model"`` dict): there the state's keys are this rank's share, and the
    others (another pipeline stage's layers) belong to other ranks; the whole model would
    not fit one."""
    node: Any = state
    for key in path:
        if not isinstance(node, dict):
            return True
        if key not in node:
            return node is state or not node
        node = node[key]
    return True


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in manifest: upgrade torch")
    return dtype


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 CPU view of ``t`` (copying only if it is not contiguous on CPU)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
