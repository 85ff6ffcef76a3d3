"""A plain DeepSpeed training script, as users bring them: it has never heard of hpctrain.

The shape of DeepSpeed's getting-started tutorial: ``deepspeed.init_distributed()``, a model
handed to ``deepspeed.initialize`` with a ZeRO-1 config, ``engine.backward``/``engine.step``,
``engine.save_checkpoint`` every few steps and ``engine.load_checkpoint`` on start. It never
destroys its process group. Runs on the CPU accelerator with gloo (``DS_ACCELERATOR=cpu``).
``$EXIT_PATH`` chooses how it leaves after the work (tests/programs/exit_paths.py); rank 0
appends JSON events to ``$EVENTS`` (start, step, end). As the tutorial's scripts do, it
declares ``--local_rank`` (DeepSpeed's launcher passes it; hpctrain only with ``[run]
local_rank_arg``): every rank appends what it got, beside ``LOCAL_RANK``, as an ``args`` event.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import exit_paths

os.environ.setdefault("DS_ACCELERATOR", "cpu")   # read when deepspeed is imported
import deepspeed  # noqa: E402
import torch  # noqa: E402


def log(every_rank: bool = False, **event: object) -> None:
    if every_rank or os.environ.get("RANK", "0") == "0":
        with open(os.environ["EVENTS"], "a") as fh:
            fh.write(json.dumps({**event, "time": time.time()}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1,
                        help="local rank passed from distributed launcher")
    parser.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", "6")))
    args = parser.parse_args()
    exit_paths.arm()
    ckpt_dir, steps = os.environ["CKPT_DIR"], args.steps
    log(every_rank=True, event="args", rank=os.environ.get("RANK"), local_rank=args.local_rank,
        env_local_rank=os.environ.get("LOCAL_RANK"), node=os.environ.get("SLURMD_NODENAME"))
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1},
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    start = 0
    if os.path.exists(os.path.join(ckpt_dir, "latest")):
        _, client = engine.load_checkpoint(ckpt_dir)
        start = client["step"]
    log(event="start", step=start, restart=os.environ.get("SLURM_RESTART_COUNT", "0"))
    for step in range(start, steps):
        g = torch.Generator().manual_seed(step)
        loss = engine(torch.randn(4, 8, generator=g)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        exit_paths.at_step(step)
        time.sleep(0.3)
        log(event="step", step=step)
        if (step + 1) % 3 == 0:
            engine.save_checkpoint(ckpt_dir, client_state={"step": step + 1})
    log(event="end", step=steps)
    exit_paths.leave(torch.distributed.barrier)


if __name__ == "__main__":
    main()
