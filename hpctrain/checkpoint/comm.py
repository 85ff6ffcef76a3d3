"""The few collectives the commit protocol needs, with a single-process fallback.

Under torch.distributed the manager creates its own gloo group at construction: the
checkpoint's small object collectives then never interleave with the training job's
collectives (NCCL or gloo), and they may run from the async writer thread.
"""

from __future__ import annotations

from typing import Any


class Comm:
    """rank/world plus barrier, gather and broadcast of small picklable objects."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.active = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.active else 0
        self.world = dist.get_world_size() if self.active else 1
        self.group = dist.new_group(backend="gloo") if self.active and self.world > 1 else None
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
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        if not self.active:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        self._dist.gather_object(obj, out, dst=self._global(0), group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        self._dist.broadcast_object_list(box, src=self._global(0), group=self.group)
        return box[0]

    def _global(self, group_rank: int) -> int:
        return self._dist.get_global_rank(self.group, group_rank)
