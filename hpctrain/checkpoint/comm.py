"""The few collectives the commit protocol needs, with a single-process fallback.

Under torch.distributed the manager creates its own gloo group at construction: the
checkpoint's small object collectives then never interleave with the training job's
collectives (NCCL or gloo), they may run from the async writer thread, and their timeout
is the save's, not the training's collective timeout.
"""

from __future__ import annotations

import os
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
    """rank/world plus barrier, gather and broadcast of small picklable objects."""

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
