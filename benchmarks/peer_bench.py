"""What peer copies of snapshots cost per training step (issue 42, item 4), as a ratio
against the same loop without them, measured in one run:

    .venv/bin/python benchmarks/peer_bench.py [--params 4M] [--rounds 12] [--block 8]

Four ranks as srun starts them (their own processes, gloo), on two emulated nodes
(``$SLURMD_NODENAME`` n1, n1, n2, n2; node memory under a temporary directory), train a
data-parallel MLP of --params parameters with SGD and momentum (the state a snapshot
copies: weights and moments, 8 bytes a parameter), all-reducing each gradient, in three
ways:

- ``none``: no snapshot;
- ``snapshot``: ``CheckpointManager.snapshot`` after every step (host memory only);
- ``peers``: the same through a second manager with peer copies on
  (``$HPCTRAIN_PEER_COPIES=1``): each snapshot also written into node memory, checksummed
  and sent to the partner on the other node.

The three take turns in the same processes, --block steps each, --rounds times (the
order rotates each round): the machine's noise (a 2-core VM whose step times drift by 10%
from one start of the processes to the next) falls on all three alike, and each round
gives one ratio. A ``peers`` block's time includes waiting, after its last step, for that
step's copy to be sent (which a longer run would overlap with the next step): the cost is
counted in full, not hidden in the next block.

Figures: per mode the median over rounds of the block's mean step time (rank 0), and the
median of the rounds' ratios peers/snapshot (what peer copies add to a loop that
snapshots every step: target <= 1.05) and peers/none. Nothing here needs Slurm; the
node-loss figures (loss -> first step on the spare, steps lost) come from
tests/cluster/test_peer_copies_cluster.py.
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
    managers = {}
    for mode, peers in (("snapshot", "0"), ("peers", "1")):     # (collective, in order)
        os.environ["HPCTRAIN_PEER_COPIES"] = peers
        managers[mode] = CheckpointManager(Path(args.dir) / mode, keep_last=1)
    copies = managers["peers"]._memory.peers
    assert copies is not None, "peer copies did not start"
    step = 0

    def steps(mode: str, n: int) -> float:
        """``n`` steps in ``mode``: their mean time (after the last copy's send)."""
        nonlocal step
        mgr = managers.get(mode)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            x = torch.randn(args.batch, width,
                            generator=torch.Generator().manual_seed(step * 10 + rank))
            opt.zero_grad()
            model(x).square().mean().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            step += 1
            if mgr is not None:
                t1 = time.perf_counter()
                mgr.snapshot(step, {"model": model.state_dict(), "opt": opt.state_dict()})
                stalls[mode].append(time.perf_counter() - t1)
        if mode == "peers":
            copies.flush()
        dist.barrier()
        cpu[mode].append((time.process_time() - c0) / n)
        return (time.perf_counter() - t0) / n

    stalls: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for mode in MODES:
        steps(mode, args.warmup)
    stalls, cpu = {m: [] for m in MODES}, {m: [] for m in MODES}
    sent0, puts0 = copies.sent, copies.puts
    blocks: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES[r % 3:] + MODES[:r % 3]:
            blocks[mode].append(steps(mode, args.block))
    sent = [copies.sent - sent0, copies.puts - puts0]
    for mgr in managers.values():
        mgr.close()
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "blocks": blocks, "sent": sent,
            "cpu": {m: statistics.median(v) for m, v in cpu.items()},
            "stalls": {m: statistics.median(v) if v else 0.0 for m, v in stalls.items()}}))
    dist.barrier()
    dist.destroy_process_group()


def one_run(args: argparse.Namespace, base: Path, port: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    out = work / "times.json"
    for mode in ("snapshot", "peers"):
        (work / "ckpt" / mode).mkdir(parents=True)
    env = {**os.environ, "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "HPCTRAIN_RUN_ID": "bench",
           "HPCTRAIN_RESTART_COUNT": "0", "HPCTRAIN_LOCAL_DIR": str(work / "shm"),
           "HPCTRAIN_PROGRESS_TOKEN": "bench-token"}
    argv = [sys.executable, __file__, "--worker", "--dir", str(work / "ckpt"),
            "--out", str(out), "--params", str(args.params), "--rounds", str(args.rounds),
            "--block", str(args.block), "--warmup", str(args.warmup),
            "--batch", str(args.batch)]
    procs = [subprocess.Popen(argv, env={**env, "RANK": str(r),
                                         "SLURMD_NODENAME": "n1" if r < 2 else "n2"})
             for r in range(4)]
    if any(p.wait(timeout=3600) for p in procs):
        raise SystemExit("a rank failed")
    return json.loads(out.read_text())


def parse_count(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6}.get(text[-1].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=parse_count, default=parse_count("4M"))
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block", type=int, default=8, help="steps of one mode in a row")
    ap.add_argument("--batch", type=int, default=512,
                    help="samples per rank and step: the step's work against the state's "
                         "size (a transformer step does far more per parameter than this)")
    ap.add_argument("--warmup", type=int, default=3, help="steps of each mode first, untimed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.ckpt import free_port

    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        result = one_run(args, Path(tmp), free_port())
    blocks = result["blocks"]
    for r in range(args.rounds):
        print(f"round {r + 1}: " + ", ".join(f"{m} {blocks[m][r] * 1000:.1f} ms"
                                             for m in MODES))
    med = {m: statistics.median(v) for m, v in blocks.items()}
    ratio = {o: statistics.median(p / b for p, b in zip(blocks["peers"], blocks[o]))
             for o in ("snapshot", "none")}
    print(f"{args.params / 1e6:.1f}M parameters ({args.params * 8 / 1e6:.0f} MB snapshot per "
          f"rank), batch {args.batch}, 4 ranks on 2 nodes, {args.rounds} rounds of "
          f"{args.block} steps of each, median over rounds of a block's mean step:")
    for m in MODES:
        print(f"  {m:9s} {med[m] * 1000:8.1f} ms   snapshot() itself "
              f"{result['stalls'][m] * 1000:6.1f} ms")
    print(f"peers / snapshot = {ratio['snapshot']:.3f}x (median of the rounds' ratios; "
          f"target <= 1.05); peers / none = {ratio['none']:.3f}x")
    # where four ranks keep the cores busy, the CPU the copies take is a step's, unless
    # it fits in the training's idle moments
    more = result["cpu"]["peers"] - result["cpu"]["snapshot"]
    cores = os.cpu_count() or 1
    print(f"CPU a step, rank 0's process (every thread): {result['cpu']['snapshot'] * 1000:.1f}"
          f" ms with the snapshot alone, {result['cpu']['peers'] * 1000:.1f} ms with peer "
          f"copies (+{more * 1000:.1f} ms: its checksums, send and its ward's receive); "
          f"4 ranks' training fills {4 * result['cpu']['snapshot'] / cores / med['snapshot']:.0%}"
          f" of {cores} cores: {1 + 4 * more / cores / med['snapshot']:.3f}x if none of that "
          "fit in idle moments")
    sent, puts = result["sent"]
    print(f"rank 0's snapshots that reached its partner whole: {sent} of {puts} (a send "
          "still on its way when the next snapshot comes is cut short: the training never "
          "waits for the network)")


if __name__ == "__main__":
    main()
