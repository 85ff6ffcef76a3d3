"""A plain torchrun DDP training script, as users bring them: it has never heard of hpctrain.

The shape of PyTorch's multi-node DDP tutorial: ranks from torchrun's environment, a
model wrapped in DistributedDataParallel, and rank 0 saving a snapshot (model state and
epochs run) every few epochs, loaded again on start when it exists. No signal handling:
a SIGTERM simply kills it, and it resumes from its last snapshot when run again.

--hang-at-epoch N makes --hang-rank stop there once (the others then wait in DDP's
gradient all-reduce). A first start (no snapshot yet) "prepares data" for --startup-sleep seconds first, the
window in which a job is most often preempted on a busy cluster. Rank 0 appends one JSON
line per event to --events (start, epoch, done), which is what the tests read
(not --log: torchrun would take it for an abbreviation of its own --log-dir). $EXIT_PATH
chooses how it leaves after the work (tests/programs/exit_paths.py).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import exit_paths
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def log(path: str, **event: object) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({**event, "time": time.time()}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--snapshot", default=os.environ.get("SNAPSHOT"))
    ap.add_argument("--events", default=os.environ.get("EVENTS"))
    ap.add_argument("--epoch-sleep", type=float, default=0.5)
    ap.add_argument("--startup-sleep", type=float, default=0.0)
    ap.add_argument("--crash-at-epoch", type=int, default=-1)
    ap.add_argument("--crash-rank", type=int, default=1)
    ap.add_argument("--hang-at-epoch", type=int, default=-1)
    ap.add_argument("--hang-rank", type=int, default=1)
    args = ap.parse_args()
    exit_paths.arm()

    rank = int(os.environ["RANK"])
    if not os.path.exists(args.snapshot) and args.startup_sleep:
        if rank == 0:
            log(args.events, event="startup")
        time.sleep(args.startup_sleep)      # "preparing data"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    epochs_run = 0
    if os.path.exists(args.snapshot):
        snap = torch.load(args.snapshot)
        model.module.load_state_dict(snap["model"])
        epochs_run = snap["epochs_run"]
    if rank == 0:
        log(args.events, event="start", epoch=epochs_run,
            restart=os.environ.get("SLURM_RESTART_COUNT", "0"))
    for epoch in range(epochs_run, args.epochs):
        if epoch == args.crash_at_epoch and rank == args.crash_rank:
            raise RuntimeError(f"bad batch in epoch {epoch}")
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        hung = args.snapshot + ".hung"
        if epoch == args.hang_at_epoch and rank == args.hang_rank and not os.path.exists(hung):
            open(hung, "w").close()     # once: the run after the hang goes through
            time.sleep(100000)          # the others wait in backward's gradient all-reduce
        opt.zero_grad()
        loss.backward()
        opt.step()
        exit_paths.at_step(epoch)
        time.sleep(args.epoch_sleep)
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
            log(args.events, event="epoch", epoch=epoch)
            if (epoch + 1) % args.save_every == 0:
                tmp = args.snapshot + ".tmp"
                torch.save({"model": model.module.state_dict(), "epochs_run": epoch + 1}, tmp)
                os.replace(tmp, args.snapshot)
    if rank == 0:
        log(args.events, event="done", epoch=args.epochs)
    exit_paths.leave(dist.barrier)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
