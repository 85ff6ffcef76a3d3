"""docs/fault-recovery.md's "ten lines", as users copied them before the recipe gained its
last line: a model, an optimizer, hpctrain.runtime and the checkpoint manager, and nothing
else. It never calls ``ctx.close()`` or ``ckpt.close()``: the runtime must leave cleanly by
itself (issue 31: a job that did its work must never be reported failed).

The recipe's lines are kept as the doc writes them; what is not in the recipe (the model,
the step) is as small as it can be; the checkpoints go where the spec's
``[checkpoint]`` says. ``$EXIT_PATH`` chooses how it
leaves after the work (tests/programs/exit_paths.py); rank 0 appends JSON events to
``$EVENTS`` (start, step, end).
"""

from __future__ import annotations

import json
import os
import time

import exit_paths
import torch

import hpctrain.runtime
from hpctrain.checkpoint import CheckpointManager

exit_paths.arm()
total_steps = int(os.environ.get("STEPS", "6"))   # saves: the spec's interval_steps
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def log(**event: object) -> None:
    if os.environ.get("RANK", "0") == "0":
        with open(os.environ["EVENTS"], "a") as fh:
            fh.write(json.dumps({**event, "time": time.time()}) + "\n")


def train_one_step(step: int) -> None:
    g = torch.Generator().manual_seed(step)          # the data of a step: a function of step
    loss = model(torch.randn(4, 8, generator=g)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():                      # data parallel, averaged by hand
        torch.distributed.all_reduce(p.grad)
        p.grad /= ctx.world_size
    opt.step()
    exit_paths.at_step(step)
    time.sleep(0.3)
    log(event="step", step=step)


# ---- the recipe ------------------------------------------------------------------------
ctx = hpctrain.runtime.init()                      # process group, mesh, signal flag
ckpt = CheckpointManager()                         # the spec's [checkpoint]: dir, keep_last...
state = {"model": model.state_dict(), "optim": opt.state_dict()}
start = ckpt.load_latest(state) or 0               # in place; None on a fresh start
model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])
log(event="start", step=start, restart=ctx.restart_count)
for step in range(start, total_steps):
    train_one_step(step)                           # data for `step` must not depend on history
    if ctx.stop_requested():                       # collective: call on every rank, every step
        ckpt.save(step + 1, {"model": model.state_dict(), "optim": opt.state_dict()})
        ckpt.close(); ctx.exit_for_requeue(step + 1)
    ckpt.save_if_due(step + 1, {"model": model.state_dict(), "optim": opt.state_dict()})
# ---- end of the recipe -------------------------------------------------------------------
log(event="end", step=total_steps)
exit_paths.leave(torch.distributed.barrier)
