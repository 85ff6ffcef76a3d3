"""What measuring each rank's own time per step costs (issue 56, item 1: target <= 1% of
step time), as a ratio against the same loop without it, measured in one run:

    .venv/bin/python benchmarks/pace_bench.py [--ranks 4] [--rounds 8] [--block 40]
        [--step-ms 20]

Four ranks (their own processes, gloo on this machine's loopback) train a data-parallel
MLP two ways, block by block in the same processes (the order rotates each round, so the
machine's drift falls on both alike):

- ``plain``: each gradient all-reduced with torch.distributed's own ``all_reduce`` (the
  runtime's wrapper taken off), DDP's timers at their default sample rate;
- ``pace``: the runtime's measurement on, as a job gets it: every blocking collective
  timed, a step boundary per step (:class:`hpctrain.runtime.pace.Pace`), and the figure
  read each step (the heartbeat reads it every 2 s: the worst case).

Two loops: ``collectives`` (a manual all-reduce per parameter tensor: the most timed calls
per step) and ``ddp`` (DistributedDataParallel, its timers sampled every iteration with
the measurement on, every 100th without). ``--step-ms`` of busy compute per step stands in
for a real step's work (a 20 ms step is short for a GPU job: the ratio is an upper bound).

Figures: per loop, the median over rounds of the block's mean step time (rank 0) for each
way, and the median of the rounds' ratios pace/plain.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < end:
        x += 1


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    from hpctrain.runtime import pace as pace_mod

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    pace = pace_mod.install(pace_mod.Pace())
    timed = {name: getattr(dist, name) for name in pace_mod.COLLECTIVES if hasattr(dist, name)}
    plain = {name: fn.__wrapped__ for name, fn in timed.items()}
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
    ddp = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)]))
    x = torch.randn(16, 64)

    def step(loop: str, on: bool) -> None:
        busy(args.step_ms)
        if loop == "ddp":
            ddp(x).sum().backward()
        else:
            model(x).sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
        if on:
            pace.boundary()
            pace.own()

    def use(on: bool, loop: str) -> None:
        for name, fn in (timed if on else plain).items():
            setattr(dist, name, fn)
        if loop == "ddp":
            ddp._set_ddp_runtime_logging_sample_rate(1 if on else 100)

    rows = []
    for r in range(args.rounds):
        ways = [("plain", False), ("pace", True)]
        for loop in ("collectives", "ddp"):
            for name, on in (ways if r % 2 == 0 else ways[::-1]):
                use(on, loop)
                pace.restart()
                for _ in range(3):
                    step(loop, on)
                dist.barrier()
                start = time.perf_counter()
                for _ in range(args.block):
                    step(loop, on)
                dist.barrier()
                rows.append((r, loop, name, (time.perf_counter() - start) / args.block))
    if rank == 0:
        with open(out, "w") as fh:
            for row in rows:
                fh.write(" ".join(map(str, row)) + "\n")
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--block", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=20.0)
    args = ap.parse_args()
    import tempfile

    import torch.multiprocessing as mp

    out = os.path.join(tempfile.mkdtemp(), "rows.txt")
    mp.spawn(worker, args=(args.ranks, free_port(), args, out), nprocs=args.ranks, join=True)
    rows = [line.split() for line in Path(out).read_text().splitlines()]
    print(f"pace_bench: {args.ranks} ranks, {args.rounds} rounds of {args.block} steps, "
          f"{args.step_ms:g} ms of compute a step")
    for loop in ("collectives", "ddp"):
        mine = [r for r in rows if r[1] == loop]
        by = {w: statistics.median(float(r[3]) for r in mine if r[2] == w)
              for w in ("plain", "pace")}
        ratios = [float(p[3]) / float(q[3]) for p in mine for q in mine
                  if p[0] == q[0] and p[2] == "pace" and q[2] == "plain"]
        print(f"  {loop:<12} step plain {by['plain'] * 1000:.2f} ms, pace "
              f"{by['pace'] * 1000:.2f} ms; pace/plain median over rounds "
              f"{statistics.median(ratios):.4f} (rounds: "
              f"{', '.join(f'{x:.3f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
