"""Savers for tests/unit/test_ckpt_faults.py, each killed with SIGKILL at a commit point or
at a random time (forked by helpers.ckpt.Forked: torch is imported already). A saver says
each step it committed on ``said`` (a pipe to the test)."""

from __future__ import annotations

import os
from typing import Any


def save_steps(said: Any, root: str, fault: str, rows: int, steps: int,
               async_save: bool) -> None:
    """Save ``steps`` steps after the newest one; the fault point ``fault`` is armed only
    after two commits (``$HPCTRAIN_CKPT_FAULT``: the checkpoint code kills its process
    there)."""
    from hpctrain.checkpoint import CheckpointManager
    from helpers.ckpt import make_state

    os.environ.pop("HPCTRAIN_CKPT_FAULT", None)     # armed here, never inherited
    with CheckpointManager(root, keep_last=2, async_save=async_save) as mgr:
        first = (mgr.latest_step() or 0) + 1
        for step in range(first, first + steps):
            if step == 3 and fault:
                os.environ["HPCTRAIN_CKPT_FAULT"] = fault
            mgr.save(step, make_state(step, rows))
            said.send(step)


def resave(said: Any, root: str, fault: str, async_save: bool) -> None:
    """Save step 5, then step 5 again with other values (resumed from 5, saving 5 again)
    with the fault point armed."""
    from hpctrain.checkpoint import CheckpointManager
    from helpers.ckpt import make_state

    os.environ.pop("HPCTRAIN_CKPT_FAULT", None)
    with CheckpointManager(root, keep_last=1, async_save=async_save) as mgr:
        mgr.save(5, make_state(5))
        mgr.wait()
        os.environ["HPCTRAIN_CKPT_FAULT"] = fault
        mgr.save(5, make_state(6))
