"""The preflight check's node side (``[health] preflight``): run once per node before a
run's first step (``python -m hpctrain.runtime.preflight [SECONDS]``, by the supervisor
through ``srun --overlap``), it times a matrix multiply on each of the node's GPUs (on the
CPU where there is none: the devcluster) for about SECONDS and prints the slowest one's
rate, one line (:class:`hpctrain.protocol.preflight.NodeSpeed`). The supervisor compares
the nodes: a node far slower than the others' median is left out of the step when a spare
can take its place.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from hpctrain.protocol.preflight import SECONDS, NodeSpeed


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


def main(argv: list[str]) -> int:
    import torch

    seconds = float(argv[0]) if argv else SECONDS
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        rates = [rate(torch.device("cuda", i), seconds / gpus) for i in range(gpus)]
        speed = NodeSpeed(node, min(rates), "cuda", gpus, seconds)
    else:
        torch.set_num_threads(1)            # one rank's share of the node, as a step has it
        speed = NodeSpeed(node, rate(torch.device("cpu"), seconds), "cpu", 0, seconds)
    print(speed.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
