"""A torch-free stand-in training rank for the scale rehearsal (benchmarks/rehearsal.py):
many of them fit on one machine where real torch ranks would not. It reports through the
runtime's real progress reporter (hpctrain.runtime.progress, the relay and the channel
to the supervisor, as a real rank does) and does one "step" every --step-s: set the step,
reach the step boundary, all-reduce through the recorded-behaviour stand-in of
torch.distributed (tests/programs/standin_torch; its rendezvous, a file per rank beside
--events, starts the ranks together).

--hang RANK:STEP: on the first run's first attempt, rank RANK stops at STEP outside any
collective (stuck in its data loader) and every other rank waits for it in the
all-reduce of that step, as in a real hang. The hung rank appends when it stopped to
--events. A stop signal (SIGTERM, the requeue signal) ends a rank at once, like a plain
script: the supervisor requeues by Slurm's facts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "standin_torch"))
import torch.distributed as dist  # noqa: E402  (the stand-in, not torch)

from hpctrain import protocol as p  # noqa: E402
from hpctrain.runtime import progress  # noqa: E402


def log(path: str, **event: object) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({**event, "time": time.time()}) + "\n")


def stuck_in_the_data_loader() -> None:
    while True:
        time.sleep(1.0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--step-s", type=float, default=0.5)
    ap.add_argument("--hang", default="")
    ap.add_argument("--events", required=True)
    args = ap.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    node = os.environ.get("SLURMD_NODENAME", "")
    restart = int(os.environ.get(p.RESTART_COUNT) or 0)
    attempt = int(os.environ.get(p.STEP_ATTEMPT) or 0)
    for name in ("TERM", "USR1", "USR2", "INT"):
        signal.signal(getattr(signal, "SIG" + name), lambda *_: os._exit(143))
    reporter = progress.start_from_env(os.environ, rank, node)
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    dist.init_process_group(str(Path(args.events).parent / "rendezvous" / f"{restart}-{attempt}"),
                            rank, world)
    hang_rank, hang_step = (int(x) for x in args.hang.split(":")) if args.hang else (-1, -1)
    faulty = restart == 0 and attempt == 0 and hang_rank >= 0
    if faulty:
        dist.block_from(hang_step)
    if rank == 0:
        log(args.events, event="start", restart=restart, attempt=attempt)
    for step in range(args.steps):
        if reporter is not None:
            reporter.set_step(step)
            reporter.boundary()
        if faulty and rank == hang_rank and step == hang_step:
            log(args.events, event="hang", rank=rank, node=node, step=step)
            stuck_in_the_data_loader()
        dist.all_reduce(step)
        time.sleep(args.step_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
