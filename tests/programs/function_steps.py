"""A function job's callable (``hpctrain.submit_function``), pickled by reference: the job
needs tests/ on its PYTHONPATH. hpctrain.runtime, its checkpoint manager, and the exit path
of ``$EXIT_PATH`` (tests/programs/exit_paths.py); saves every 3 steps in ``$CKPT_DIR``."""

from __future__ import annotations

import os
import time


def train(steps: int) -> dict[str, int]:
    import torch

    import hpctrain.runtime
    from hpctrain.checkpoint import CheckpointManager
    from programs import exit_paths

    exit_paths.arm()
    ctx = hpctrain.runtime.init()
    ckpt = CheckpointManager(os.environ["CKPT_DIR"], keep_last=2)
    state = {"w": torch.zeros(8)}
    start = ckpt.load_latest(state) or 0
    for step in range(start, steps):
        ctx.step = step
        state["w"] += 1
        exit_paths.at_step(step)
        time.sleep(0.2)
        if ctx.stop_requested():
            ckpt.save(step + 1, state)
            ctx.exit_for_requeue(step + 1)
        if (step + 1) % 3 == 0:
            ckpt.save(step + 1, state)
    exit_paths.leave(torch.distributed.barrier)
    return {"rank": ctx.rank, "w": int(state["w"][0]), "start": start}
