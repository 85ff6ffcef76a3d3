"""A recorded-behaviour stand-in for ``torch.distributed`` (the rehearsal's ranks have no
torch and no network collective): ``init_process_group`` waits until every rank has
arrived, as torch's rendezvous does (here: a file per rank in a shared folder), so the
ranks step together; ``all_reduce`` returns at once, except that every rank but the hung
one waits in it forever from the step the hung rank stopped at, as a gloo or NCCL
all-reduce does when one rank never arrives. The waiting happens in this file, so a
rank's Python stack shows ``torch/distributed/`` like a real collective's."""

from __future__ import annotations

import os
import time
from pathlib import Path


def init_process_group(rendezvous: str, rank: int, world: int) -> None:
    """Wait until all ``world`` ranks have said they are here in folder ``rendezvous``."""
    folder = Path(rendezvous)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{rank}").write_text(str(os.getpid()))
    while len(os.listdir(folder)) < world:
        time.sleep(0.2)

_blocked_from: int | None = None


def block_from(step: int) -> None:
    """A peer stops arriving at ``step``: every all_reduce from then on waits forever."""
    global _blocked_from
    _blocked_from = step


def all_reduce(step: int) -> None:
    """One step's all-reduce: immediate, or forever once a peer stopped arriving."""
    if _blocked_from is not None and step >= _blocked_from:
        while True:            # what a collective with a missing peer does, until killed
            time.sleep(1.0)
