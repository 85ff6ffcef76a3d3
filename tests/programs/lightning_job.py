"""A PyTorch Lightning training script of the documented shape (a LightningModule, a
DataLoader, a Trainer with DDP across nodes, one srun task per device), for the devcluster
tests of hpctrain's Lightning integration. CPU only: a small MLP on synthetic data built
from a seed, nothing downloaded.

  --mode hpctrain   the Trainer gets hpctrain.integrations.lightning.HpctrainCallback:
                    progress for the watchdog, an emergency save on every stop, the exit the
                    supervisor requeues; ``trainer.fit(model)`` resumes (Lightning's own
                    resume from its HPC checkpoint under SLURM)
  --mode plain      hpctrain is never imported: Lightning's own SLURM plugin
                    (SLURMEnvironment, auto-requeue, its save on SIGUSR1); ``trainer.fit``
                    resumes from the HPC checkpoint Lightning saved itself

Rank 0 appends JSON events to --events: ``start`` (the global step it resumed at, the
run, the pid), ``step`` (each finished optimizer step) and ``done``.
  --hang RANK:STEP:RESTART:ATTEMPT   that rank sleeps in that step (the others wait for it
                                     in DDP's gradient all-reduce), on that run and attempt
  --stop-at STEP                     SIGTERM to this process in that step, as Slurm sends it
                                     on a preemption (the unit tests' one-process runs)
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
    ap.add_argument("--mode", choices=("hpctrain", "plain"), required=True)
    ap.add_argument("--root", required=True, help="the Trainer's default_root_dir")
    ap.add_argument("--events", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-sleep", type=float, default=0.3)
    ap.add_argument("--hang", default="")
    ap.add_argument("--stop-at", type=int, default=-1)
    args = ap.parse_args()

    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    rank = int(os.environ["SLURM_PROCID"])
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    attempt = int(os.environ.get("HPCTRAIN_STEP_ATTEMPT", "0"))
    hang = [int(x) for x in args.hang.split(":")] if args.hang else None

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                           torch.nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            step = self.trainer.global_step
            if hang and hang[:1] == [rank] and hang[1:] == [step, restart, attempt]:
                while True:        # the others wait in DDP's all-reduce of the gradients
                    time.sleep(3600)
            if step == args.stop_at:
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(args.step_sleep)
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
            if self.trainer.is_global_zero:
                log(args.events, event="step", step=self.trainer.global_step,
                    restart=restart, attempt=attempt)

        def on_train_start(self) -> None:
            if self.trainer.is_global_zero:
                log(args.events, event="start", step=self.trainer.global_step,
                    restart=restart, attempt=attempt, pid=os.getpid(),
                    accumulation=self.trainer.accumulate_grad_batches)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4096, 16, generator=gen)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    if args.mode == "hpctrain":
        from hpctrain.integrations.lightning import HpctrainCallback

        # a step's work for report: every rank's batch of 8 samples through a model of
        # 16x32 + 32 + 32x1 + 1 weights (about 6 x 577 FLOPs a sample)
        world = int(os.environ["SLURM_NTASKS"])
        callbacks, plugins = [HpctrainCallback(samples_per_step=8 * world,
                                               flops_per_sample=6 * 577)], []
    else:
        from lightning.pytorch.plugins.environments import SLURMEnvironment

        callbacks, plugins = [], [SLURMEnvironment(requeue_signal=signal.SIGUSR1)]
    nodes = int(os.environ["SLURM_JOB_NUM_NODES"])
    trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ["SLURM_NTASKS_PER_NODE"]),
                         num_nodes=nodes, strategy="ddp", max_steps=args.steps,
                         default_root_dir=args.root, callbacks=callbacks, plugins=plugins,
                         enable_progress_bar=False, enable_model_summary=False, logger=False,
                         enable_checkpointing=False)
    trainer.fit(Regression(), data)
    if trainer.is_global_zero:
        log(args.events, event="done", step=trainer.global_step, restart=restart)


if __name__ == "__main__":
    main()
