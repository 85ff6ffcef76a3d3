"""A training loop written with Hugging Face Accelerate, as its docs shape one (Accelerator,
prepare, backward, save_state/load_state), with hpctrain's runtime attached to the process
group Accelerate made: the recipe of docs/existing-scripts.md. CPU only, synthetic data.

Rank 0 appends JSON events to --events: ``start`` (the step it resumed at), ``step``,
``done``. ``--stop-at STEP``: SIGTERM to this process in that step, as Slurm sends it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time


def log(path: str, **event: object) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({**event, "time": time.time()}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state", required=True, help="where accelerator.save_state writes")
    ap.add_argument("--events", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--stop-at", type=int, default=-1)
    args = ap.parse_args()

    import torch
    from accelerate import Accelerator

    import hpctrain.runtime

    accelerator = Accelerator(cpu=True)
    ctx = hpctrain.runtime.attach()          # after Accelerator(): its process group
    torch.manual_seed(11)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(7))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, True)),
                                       batch_size=8)
    model, opt, data = accelerator.prepare(model, opt, data)
    accelerator.register_for_checkpointing(counter := Counter())
    if os.path.isdir(args.state):            # resume: the state the last stop saved
        accelerator.load_state(args.state)
    if accelerator.is_main_process:
        log(args.events, event="start", step=counter.step, restart=ctx.restart_count)
    batches = iter(data)
    while counter.step < args.steps:
        ctx.step = counter.step
        if counter.step == args.stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        xb, yb = next(batches)
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        counter.step += 1
        if accelerator.is_main_process:
            log(args.events, event="step", step=counter.step)
        if ctx.stop_requested():             # every rank agrees, at a step boundary
            accelerator.save_state(args.state)
            ctx.exit_for_requeue(counter.step)
    if accelerator.is_main_process:
        log(args.events, event="done", step=counter.step)


class Counter:
    """The loop's own position, saved and loaded with the state."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


if __name__ == "__main__":
    main()
