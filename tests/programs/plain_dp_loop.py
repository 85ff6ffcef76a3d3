"""The plainest data-parallel loop under ``hpctrain.runtime.run``, as a user writes it (not
shaped for hpctrain's tests): a ``torch.nn.Sequential``, ``torch.distributed.all_reduce``
on each gradient on the default group, ``opt.step()``, ``ctx.stop_requested()``, and a
``CheckpointManager`` built inside ``main`` that saves every ``--save-every`` steps.

Faults, each on one rank in one attempt of the job's first run (``KIND@STEP:RANK:ATTEMPT``,
repeatable): ``crash`` raises before the step's forward pass (just after a save when STEP
is a multiple of --save-every), ``hang`` sleeps in Python before it (the others wait in the
all-reduce), ``collective-hang`` waits in a receive nobody sends (stuck in C++, as the
others then are in the all-reduce), ``save-crash`` puts what cannot be pickled into that
rank's save (the save fails on every rank), ``oom`` asks for more device memory than any
device has (``torch.OutOfMemoryError`` on a GPU: not sticky, restarted in place), and
``device-error`` makes a real sticky CUDA error (a device-side assert; GPU only). The model
and the data live on ``ctx.device`` (a GPU under NCCL, else the CPU). Rank 0 appends JSON
events to --events; every rank writes its final parameters to ``--final/rank-N.pt``
(bitwise comparisons). ``--ballast-mb`` makes the state as big as a real one's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import hpctrain.runtime
from hpctrain.checkpoint import CheckpointManager


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--snapshot-every", type=int, default=0,
                    help="CheckpointManager.snapshot every N steps (host memory; with peer "
                         "copies also a partner node's)")
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--step-work", type=int, default=0,
                    help="128x128 matmuls of busy work in each step before its all-reduce "
                         "(~0.05 ms each here): a CPU-bound step a slowed node stretches")
    ap.add_argument("--ballast-mb", type=int, default=0,
                    help="MB of each rank's own state beside the model (a big optimizer's, "
                         "as it were), every value its step and rank: a load of another "
                         "step's, or of another rank's, raises")
    ap.add_argument("--global-batch", type=int, default=0,
                    help="each step one fixed global batch of this many samples (its seed: "
                         "the step), rank r taking samples r::world in ctx.accumulation "
                         "micro-batches, the gradients summed over it: the same training "
                         "at any data-parallel width (a shrink changes only the sums' order)")
    ap.add_argument("--float64", action="store_true", help="the model and data in float64")
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--events", required=True)
    ap.add_argument("--final", default="")
    ap.add_argument("--fault", action="append", default=[],
                    help="KIND@STEP:RANK:ATTEMPT[:RESTART]: that fault before that step on "
                         "that rank, attempt and run (RESTART: 0 when left out); ATTEMPT and "
                         "RESTART may be '*' (every one: a deterministic bug)")
    ap.add_argument("--init", action="store_true",
                    help="hpctrain.runtime.init() instead of run(): no restarts in these "
                         "processes (a failure restarts the step in new ones)")
    return ap.parse_args()


def faults_of(args: argparse.Namespace, ctx: hpctrain.runtime.Context) -> dict[str, int]:
    mine = {}
    for spec in args.fault:
        kind, _, where = spec.partition("@")
        step, rank, attempt, *restart = where.split(":")
        if int(rank) == ctx.rank and attempt in ("*", str(ctx.attempt)) and \
                (restart or ["0"])[0] in ("*", str(ctx.restart_count)):
            mine[kind] = int(step)
    return mine


def log(path: str, **event: object) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({**event, "time": time.time()}) + "\n")


def device_fault(kind: str, device: torch.device) -> None:
    """A fault of the device itself: ``oom`` (not sticky) or ``device-error`` (sticky)."""
    if kind == "oom":
        torch.empty(1 << 45, dtype=torch.uint8, device=device)     # 32 TiB
    elif device.type != "cuda":
        raise SystemExit("plain_dp_loop: the device-error fault needs a GPU")
    else:   # an index out of range, checked on the device: CUDA's sticky assert
        torch.zeros(4, device=device)[torch.tensor([1 << 20], device=device)].sum().item()


def global_step(args: argparse.Namespace, ctx: hpctrain.runtime.Context,
                model: torch.nn.Module, step: int) -> None:
    """This rank's part of step ``step``'s fixed global batch: samples rank::world, in
    ``ctx.accumulation`` micro-batches (more after a shrink), each loss a share of the
    global mean: summed over the ranks the gradient is the global batch's, at any width."""
    dtype = next(model.parameters()).dtype
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(args.global_batch, 16, generator=gen, dtype=dtype)
    y = torch.randn(args.global_batch, 1, generator=gen, dtype=dtype)
    mine = torch.arange(ctx.rank, args.global_batch, ctx.world_size)
    for part in mine.tensor_split(ctx.accumulation):
        xs, ys = x[part].to(ctx.device), y[part].to(ctx.device)
        (((model(xs) - ys) ** 2).sum() / args.global_batch).backward()


def ballast(args: argparse.Namespace, step: int, rank: int) -> dict:
    """The state's ballast at ``step`` on ``rank`` (none without --ballast-mb)."""
    if not args.ballast_mb:
        return {}
    return {"ballast": torch.full((args.ballast_mb << 18,), float(step * 10 + rank))}


def main(ctx: hpctrain.runtime.Context, args: argparse.Namespace) -> int:
    faults = faults_of(args, ctx)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model.to(ctx.device, torch.float64 if args.float64 else torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    mgr = CheckpointManager(args.ckpt_dir, keep_last=2)
    state = {"model": model.state_dict(), "opt": opt.state_dict(), **ballast(args, 0, ctx.rank)}
    start = mgr.load_latest(state) or 0
    if args.ballast_mb and not torch.equal(state["ballast"], ballast(args, start, ctx.rank)
                                           ["ballast"]):
        raise RuntimeError(f"rank {ctx.rank} loaded step {start} with another step's ballast")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    if ctx.rank == 0:
        log(args.events, event="start", step=start, attempt=ctx.attempt,
            restart=ctx.restart_count, pid=os.getpid(), device=str(ctx.device),
            backend=str(dist.get_backend()), world=ctx.world_size,
            accumulation=ctx.accumulation)
    for step in range(start, args.steps):
        if faults.get("crash") == step:
            raise RuntimeError(f"simulated crash before step {step}")
        if faults.get("hang") == step:
            while True:
                time.sleep(3600)
        if faults.get("collective-hang") == step:     # stuck in C++: a receive nobody sends
            dist.recv(torch.zeros(1, device=ctx.device), src=(ctx.rank + 1) % ctx.world_size,
                      tag=4242)
        for kind in ("oom", "device-error"):
            if faults.get(kind) == step:
                device_fault(kind, ctx.device)
        opt.zero_grad()
        if args.global_batch:
            global_step(args, ctx, model, step)
        else:
            gen = torch.Generator().manual_seed(step * 1000 + ctx.rank)
            x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 1, generator=gen)
            x, y = x.to(ctx.device), y.to(ctx.device)
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
        busy = torch.ones(128, 128) / 128     # compute the state never sees: bitwise alike
        for _ in range(args.step_work):
            busy = busy @ busy
        for p in model.parameters():
            dist.all_reduce(p.grad)
            if not args.global_batch:       # (there: a sum over the global batch already)
                p.grad /= ctx.world_size
        opt.step()
        time.sleep(args.step_sleep)
        if ctx.rank == 0:
            log(args.events, event="step", step=step, attempt=ctx.attempt,
                restart=ctx.restart_count)
        done = step + 1
        if ctx.stop_requested():
            mgr.save(done, {"model": model.state_dict(), "opt": opt.state_dict(),
                            **ballast(args, done, ctx.rank)})
            mgr.close()
            ctx.exit_for_requeue(done)
        if args.snapshot_every and done % args.snapshot_every == 0 and done < args.steps:
            mgr.snapshot(done, {"model": model.state_dict(), "opt": opt.state_dict(),
                                **ballast(args, done, ctx.rank)})
        if done % args.save_every == 0 and done < args.steps:
            saved = {"model": model.state_dict(), "opt": opt.state_dict(),
                     **ballast(args, done, ctx.rank)}
            if faults.get("save-crash") == done:
                saved["broken"] = lambda: None    # cannot be pickled: the save fails
            mgr.save(done, saved)
    mgr.close()
    if args.final:
        os.makedirs(args.final, exist_ok=True)
        torch.save({k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                   os.path.join(args.final, f"rank-{ctx.rank}.pt"))
    if ctx.rank == 0:
        log(args.events, event="done", step=args.steps, attempt=ctx.attempt)
    return 0


if __name__ == "__main__":
    arguments = parse()
    if arguments.init:
        sys.exit(main(hpctrain.runtime.init(), arguments))
    sys.exit(hpctrain.runtime.run(lambda ctx: main(ctx, arguments)))
