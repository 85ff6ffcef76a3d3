"""What peer copies of snapshots cost per training step (issue 42, item 4), as a ratio
against the same loop without them, measured in one run:

    .venv/bin/python benchmarks/peer_bench.py [--params 4M] [--steps 40] [--repeat 3]

Four ranks as srun starts them (their own processes, gloo), on two emulated nodes
(``$SLURMD_NODENAME`` n1, n1, n2, n2; node memory under a temporary directory), train a
data-parallel MLP of --params parameters with SGD and momentum (the state a snapshot
copies: weights and moments, 8 bytes a parameter), all-reducing each gradient, in three
ways, interleaved in each repetition (the order rotates):

- ``none``: no snapshot;
- ``snapshot``: ``CheckpointManager.snapshot`` after every step (host memory only);
- ``peers``: the same with peer copies on (``$HPCTRAIN_PEER_COPIES=1``): each snapshot
  also written into node memory, checksummed and sent to the partner on the other node.

Figures: the median step time of each (rank 0, after --warmup steps), and the ratios
peers/snapshot (what peer copies add to a loop that snapshots every step: target <= 1.05)
and peers/none. Nothing here needs Slurm; the node-loss figures (loss -> first step on
the spare, steps lost) come from tests/cluster/test_peer_copies_cluster.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "snapshot", "peers")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    width = int((args.params / 2) ** 0.5)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mgr = CheckpointManager(args.dir, keep_last=1) if args.mode != "none" else None
    times, stalls = [], []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        x = torch.randn(args.batch, width,
                        generator=torch.Generator().manual_seed(step * 10 + rank))
        opt.zero_grad()
        model(x).square().mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        if mgr is not None:
            t1 = time.perf_counter()
            mgr.snapshot(step + 1, {"model": model.state_dict(), "opt": opt.state_dict()})
            stalls.append(time.perf_counter() - t1)
        times.append(time.perf_counter() - t0)
    peers = mgr._memory.peers if mgr is not None else None
    sent = [peers.sent, peers.puts] if peers is not None else [0, 0]
    if mgr is not None:
        mgr.close()
    if rank == 0:
        Path(args.out).write_text(json.dumps({"times": times[args.warmup:], "sent": sent,
                                              "stalls": stalls[args.warmup:] or [0.0]}))
    dist.barrier()
    dist.destroy_process_group()


def one_run(mode: str, args: argparse.Namespace, base: Path,
            port: int) -> tuple[float, list, float]:
    work = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=base))
    (work / "ckpt").mkdir()
    out = work / "times.json"
    env = {**os.environ, "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "HPCTRAIN_RUN_ID": "bench",
           "HPCTRAIN_RESTART_COUNT": "0", "HPCTRAIN_LOCAL_DIR": str(work / "shm"),
           "HPCTRAIN_PROGRESS_TOKEN": "bench-token",
           "HPCTRAIN_PEER_COPIES": "1" if mode == "peers" else "0"}
    argv = [sys.executable, __file__, "--worker", "--mode", mode, "--dir", str(work / "ckpt"),
            "--out", str(out), "--params", str(args.params), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch", str(args.batch)]
    procs = [subprocess.Popen(argv, env={**env, "RANK": str(r),
                                         "SLURMD_NODENAME": "n1" if r < 2 else "n2"})
             for r in range(4)]
    if any(p.wait(timeout=900) for p in procs):
        raise SystemExit(f"a rank of the {mode} run failed")
    result = json.loads(out.read_text())
    return statistics.median(result["times"]), result["sent"], \
        statistics.median(result["stalls"])


def parse_count(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6}.get(text[-1].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=parse_count, default=parse_count("4M"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=512,
                    help="samples per rank and step: the step's work against the state's "
                         "size (a transformer step does far more per parameter than this)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.ckpt import free_port

    medians: dict[str, list[float]] = {m: [] for m in MODES}
    stalls: dict[str, list[float]] = {m: [] for m in MODES}
    delivered = [0, 0]
    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        for rep in range(args.repeat):
            order = MODES[rep % 3:] + MODES[:rep % 3]
            for mode in order:
                median, sent, stall = one_run(mode, args, Path(tmp), free_port())
                medians[mode].append(median)
                stalls[mode].append(stall)
                delivered = [delivered[0] + sent[0], delivered[1] + sent[1]]
            print(f"repetition {rep + 1}: " + ", ".join(
                f"{m} {medians[m][-1] * 1000:.1f} ms" for m in MODES), flush=True)
    med = {m: statistics.median(v) for m, v in medians.items()}
    per_rep = [p / s for p, s in zip(medians["peers"], medians["snapshot"])]
    state_mb = args.params * 8 / 1e6
    print(f"{args.params / 1e6:.1f}M parameters ({state_mb:.0f} MB snapshot per rank), batch "
          f"{args.batch}, 4 ranks on 2 nodes, median step time of {args.repeat} runs each:")
    for m in MODES:
        print(f"  {m:9s} {med[m] * 1000:8.1f} ms   snapshot() itself "
              f"{statistics.median(stalls[m]) * 1000:6.1f} ms")
    print(f"peers / snapshot = {med['peers'] / med['snapshot']:.3f}x (median of the "
          f"ratios within each repetition: {statistics.median(per_rep):.3f}x; target "
          f"<= 1.05); peers / none = {med['peers'] / med['none']:.3f}x")
    print(f"rank 0's snapshots that reached its partner whole: {delivered[0]} of "
          f"{delivered[1]} (a send still on its way when the next snapshot comes is cut "
          "short: the training never waits for the network)")


if __name__ == "__main__":
    main()
