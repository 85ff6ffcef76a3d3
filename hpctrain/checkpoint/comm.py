"""The few collectives the commit protocol needs, with a single-process fallback.

Under torch.distributed the manager creates its own gloo group at construction: the
checkpoint's small object collectives then never interleave with the training job's
collectives (NCCL or gloo), they may run from the async writer thread, and their timeout
is the save's, not the training's collective timeout.
"""

from __future__ import annotations

import os
import pickle
from datetime import timedelta
from typing import Any

from hpctrain import protocol

# a rank waits in the commit protocol for the slowest writer (or reader): as long as a
# save (a load) may take, never less than torch's own default
DEFAULT_GROUP_S = 1800


def group_timeout() -> timedelta:
    """The checkpoint group's collective timeout: the job's save (or start-up, which
    bounds a load) timeout when longer than DEFAULT_GROUP_S; a collective_timeout_s
    shorter than a save never bounds a save."""
    given = (os.environ.get(name, "") for name in (protocol.SAVE_TIMEOUT_S,
                                                   protocol.STARTUP_TIMEOUT_S))
    return timedelta(seconds=max([int(raw) for raw in given if raw.isdigit()]
                                 + [DEFAULT_GROUP_S]))


class Comm:
    """rank/world plus barrier, gather and broadcast of small picklable objects, and the
    collectives of bytes of the save plan (:mod:`hpctrain.checkpoint.exchange`) and the
    commit. A gather or scatter costs a rank other than 0 O(1) received bytes whatever the
    world size: torch's ``gather_object`` all-gathers every rank's size first (8 bytes per
    rank, received by every rank); these agree on the largest size in one all-reduce, or
    are told it."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.active = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.active else 0
        self.world = dist.get_world_size() if self.active else 1
        self.group = dist.new_group(backend="gloo", timeout=group_timeout()) \
            if self.active and self.world > 1 else None
        if self.group is None:
            self.active = False

    def barrier(self) -> None:
        if self.active:
            self._dist.barrier(group=self.group)

    def all_gather(self, obj: Any) -> list[Any]:
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere), pickled: as ``gather_object``,
        but the other ranks receive O(1) bytes (:meth:`gather_bytes`)."""
        if not self.active:
            return [obj]
        out = self.gather_bytes(pickle.dumps(obj, protocol=5))
        return None if out is None else [pickle.loads(data) for data in out]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        self._dist.broadcast_object_list(box, src=self._global(0), group=self.group)
        return box[0]

    def _global(self, group_rank: int) -> int:
        return self._dist.get_global_rank(self.group, group_rank)

    def all_reduce_max(self, values: list[int]) -> list[int]:
        """The element-wise maximum of every rank's ``values`` (int64), on every rank."""
        if not self.active:
            return list(values)
        import torch

        box = torch.tensor(values, dtype=torch.int64)
        self._dist.all_reduce(box, op=self._dist.ReduceOp.MAX, group=self.group)
        return [int(v) for v in box.tolist()]

    def outcomes(self, mine: Any) -> list[Any]:
        """Every rank's ``mine`` that is not None, in rank order: one all-reduce when no
        rank has one (the usual case, O(1) bytes a rank), else an all-gather."""
        if not self.all_reduce_max([0 if mine is None else 1])[0]:
            return []
        return [o for o in self.all_gather(mine) if o is not None]

    def gather_bytes(self, data: bytes, size: int | None = None) -> list[bytes] | None:
        """Every rank's ``data`` on rank 0, in rank order (None elsewhere). ``size``: an
        upper bound every rank passes alike (else agreed in one all-reduce)."""
        if not self.active:
            return [data]
        import torch

        size = self.all_reduce_max([len(data)])[0] if size is None else size
        if len(data) > size:
            raise ValueError(f"gather_bytes: {len(data)} bytes exceed the agreed {size}")
        box = _framed(data, size)
        out = [torch.empty_like(box) for _ in range(self.world)] if self.rank == 0 else None
        self._dist.gather(box, gather_list=out, dst=self._global(0), group=self.group)
        return None if out is None else [_unframed(t) for t in out]

    def scatter_bytes(self, parts: list[bytes] | None) -> bytes:
        """Rank 0's ``parts[r]`` on each rank r (``parts`` is read on rank 0 only); the
        largest part's size is broadcast first (one int)."""
        if not self.active:
            assert parts is not None
            return parts[0]
        import torch

        size = self.broadcast_int(max(map(len, parts)) if parts is not None else 0)
        box = torch.empty(size + _HEADER, dtype=torch.uint8)
        boxes = [_framed(p, size) for p in parts] if parts is not None else None
        self._dist.scatter(box, scatter_list=boxes, src=self._global(0), group=self.group)
        return _unframed(box)

    def exchange(self, sends: list[tuple[int, Any]], receive: tuple[int, int] | None) -> Any:
        """Point to point, every rank at once: each (rank, uint8 tensor) of ``sends`` sent
        to that rank, and from ``receive``'s (rank, nbytes) a tensor of nbytes received
        and returned (else None). The ranks' sends and receives must match."""
        got = None
        if not self.active:
            return got
        import torch

        d = self._dist
        ops = [d.P2POp(d.isend, t, self._global(to), group=self.group) for to, t in sends]
        if receive is not None:
            got = torch.empty(receive[1], dtype=torch.uint8)
            ops.append(d.P2POp(d.irecv, got, self._global(receive[0]), group=self.group))
        for request in d.batch_isend_irecv(ops) if ops else ():
            request.wait()
        return got

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank (one int64, not a pickle)."""
        if not self.active:
            return value
        import torch

        box = torch.tensor([value], dtype=torch.int64)
        self._dist.broadcast(box, src=self._global(0), group=self.group)
        return int(box.item())


_HEADER = 8   # a framed buffer starts with its payload's length (little-endian)


def _framed(data: bytes, size: int) -> Any:
    """``data`` in a uint8 tensor of ``size`` + header bytes, its length first."""
    import torch

    box = torch.zeros(size + _HEADER, dtype=torch.uint8)
    raw = len(data).to_bytes(_HEADER, "little") + data
    box[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return box


def _unframed(box: Any) -> bytes:
    raw = box.numpy().tobytes()
    n = int.from_bytes(raw[:_HEADER], "little")
    return raw[_HEADER:_HEADER + n]
