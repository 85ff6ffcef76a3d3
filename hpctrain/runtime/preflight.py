"""The preflight check's node side (``[health] preflight``): run once per node before a
run's first step (``python -m hpctrain.runtime.preflight [SECONDS [PORT]]``, by the
supervisor through ``srun --overlap``, one task per node), it times a matrix multiply on
each of the node's GPUs (on the CPU where there is none: the devcluster) for about SECONDS,
then, given a PORT, an all-reduce across the nodes (NCCL on GPUs, else gloo; the first
node of the step listens), and prints one line (:class:`hpctrain.protocol.preflight.
NodeSpeed`): the slowest device's rate and the all-reduce's time and bus bandwidth. The
supervisor compares the nodes: a node far slower than the others' median, or one that
never answered, is left out of the step when a spare can take its place.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from dataclasses import replace
from datetime import timedelta

from hpctrain import hostlist
from hpctrain.protocol.preflight import ALLREDUCE_TIMEOUT_S, SECONDS, NodeSpeed


def rate(device: object, seconds: float) -> float:
    """GFLOP/s of repeated square matrix multiplies on ``device`` for about ``seconds``."""
    import torch

    cuda = getattr(device, "type", "cpu") == "cuda"
    n = 4096 if cuda else 256
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b                                   # the first call pays for the set-up
    sync = torch.cuda.synchronize if cuda else (lambda *_: None)
    sync(device)
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(8):
            a @ b
        sync(device)
        reps += 8
    return reps * 2 * n ** 3 / (time.perf_counter() - start) / 1e9


def allreduce(port: int, cuda: bool) -> tuple[float, float]:
    """(median seconds, bus bandwidth GB/s) of an all-reduce across the step's tasks, one
    per node (64 MB on GPUs, 4 MB on a CPU); (0, 0) alone, or when it cannot complete
    within ALLREDUCE_TIMEOUT_S (a node that never joins: the others give up)."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("SLURM_NTASKS") or 1)
    rank = int(os.environ.get("SLURM_PROCID") or 0)
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    if world < 2 or not port or not nodes:
        return 0.0, 0.0
    try:
        dist.init_process_group("nccl" if cuda else "gloo",
                                init_method=f"tcp://{hostlist.first(nodes)}:{port}",
                                rank=rank, world_size=world,
                                timeout=timedelta(seconds=ALLREDUCE_TIMEOUT_S))
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        buf = torch.ones((64 if cuda else 4) << 18, device=device)     # float32: MB << 18
        times = []
        for _ in range(6):                  # the first sets up the connections
            start = time.perf_counter()
            dist.all_reduce(buf)
            if cuda:
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        took = statistics.median(times[1:])
        return took, 2 * (world - 1) / world * buf.numel() * 4 / took / 1e9
    except Exception:                       # noqa: BLE001 - a node that never joined
        return 0.0, 0.0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str]) -> int:
    import torch

    seconds = float(argv[0]) if argv else SECONDS
    port = int(argv[1]) if len(argv) > 1 else 0
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        rates = [rate(torch.device("cuda", i), seconds / gpus) for i in range(gpus)]
        speed = NodeSpeed(node, min(rates), "cuda", gpus, seconds)
    else:
        torch.set_num_threads(1)            # one rank's share of the node, as a step has it
        speed = NodeSpeed(node, rate(torch.device("cpu"), seconds), "cpu", 0, seconds)
    took, busbw = allreduce(port, speed.device == "cuda")
    print(replace(speed, allreduce_s=took, busbw=busbw).line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
