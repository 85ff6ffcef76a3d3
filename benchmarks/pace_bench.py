"""What measuring each rank's own time per step costs (issue 56, item 1: target <= 1% of
step time), as a ratio against the same loop without it, measured in one run:

    .venv/bin/python benchmarks/pace_bench.py [--ranks 4] [--rounds 8] [--block 40]
        [--step-ms 20]

Four ranks (their own processes, gloo on this machine's loopback) train a data-parallel
MLP two ways, block by block in the same processes (the order rotates each round, so the
machine's drift falls on both alike):

- ``plain``: the runtime's timing of ``Work.wait`` taken off, DDP's timers at their
  default sample rate;
- ``pace``: the runtime's measurement on, as a job gets it: every collective's wait
  timed, a step boundary per step (:class:`hpctrain.runtime.pace.Pace`), and the figure
  read each step (the heartbeat reads it every 2 s: the worst case).

Two loops: ``collectives`` (a manual all-reduce per parameter tensor: the most timed calls
per step) and ``ddp`` (DistributedDataParallel, its timers sampled every iteration with
the measurement on, every 100th without). ``--step-ms`` of busy compute per step stands in
for a real step's work (a 20 ms step is short for a GPU job: the ratio is an upper bound).

Figures: per loop, the median over rounds of the block's mean step time (rank 0) for each
way, and the median of the rounds' ratios pace/plain. On a 2-core machine four ranks'
blocks drift by a few percent: a ratio within that spread is "no cost seen".

``--micro`` measures the cost itself, in one process (a gloo group of one): a blocking
``all_reduce`` of one number with and without the wrapper, and a DDP iteration of a small
MLP with its timers sampled every iteration and every 100th (microseconds per call,
medians of --rounds runs of 2000 calls), plus a step boundary with the figure read.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import threading
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
        pace_mod.time_waits(on)
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


def micro(rounds: int) -> None:
    """The wrapper's, the boundary's and DDP's timers' own cost, per call (one process)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    import torch
    import torch.distributed as dist

    from hpctrain.runtime import pace as pace_mod

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    pace = pace_mod.install(pace_mod.Pace())
    one = torch.ones(1)

    def plain(tensor: object) -> None:
        pace_mod.time_waits(False)
        dist.all_reduce(tensor)

    def timed(tensor: object) -> None:
        pace_mod.time_waits(True)
        dist.all_reduce(tensor)
    ddp = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)]))
    x = torch.randn(16, 64)

    def per_call(fn, n: int = 2000) -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n * 1e6

    def ddp_step(rate: int):
        ddp._set_ddp_runtime_logging_sample_rate(rate)
        return lambda: ddp(x).sum().backward()    # (setting the rate each call: both alike)

    def boundary() -> None:
        pace.boundary()
        pace.own()

    def nothing(tensor: object, op: object = None, group: object = None,
                async_op: bool = False) -> None:
        return None

    wrapped_nothing = pace_mod._timed(nothing)   # the wrapper alone, around a no-op
    pace.owner = threading.get_ident()
    got: dict[str, list[float]] = {}
    cases = [("all_reduce", lambda: plain(one)), ("all_reduce+wrapper", lambda: timed(one)),
             ("no-op", lambda: nothing(one)), ("no-op+wrapper", lambda: wrapped_nothing(one)),
             ("ddp step, timers every 100th", lambda: ddp_step(100)()),
             ("ddp step, timers every step", lambda: ddp_step(1)()),
             ("boundary + figure", boundary)]
    for fn in (c[1] for c in cases):     # warm every path before anything is timed
        per_call(fn, 200)
    for r in range(rounds):               # the order turns each round: drift falls alike
        for name, fn in (cases if r % 2 == 0 else cases[::-1]):
            n = 300 if "ddp" in name else 20000 if "no-op" in name else 2000
            got.setdefault(name, []).append(per_call(fn, n))
    dist.destroy_process_group()
    print(f"pace_bench --micro: medians of {rounds} runs, microseconds per call")
    for name, values in got.items():
        print(f"  {name:<30} {statistics.median(values):9.2f} us")
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"  the wrapper alone costs {med['no-op+wrapper'] - med['no-op']:.2f} us a "
          f"collective (around a no-op); around gloo's all_reduce "
          f"{med['all_reduce+wrapper'] - med['all_reduce']:.2f} us, within that call's noise; "
          f"DDP's timers every step add "
          f"{med['ddp step, timers every step'] - med['ddp step, timers every 100th']:.1f} us "
          "an iteration (negative: within noise)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--block", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--micro", action="store_true", help="the cost per call, one process")
    args = ap.parse_args()
    if args.micro:
        micro(args.rounds)
        return 0
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
