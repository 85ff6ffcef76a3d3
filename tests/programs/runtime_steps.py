"""A training loop written against hpctrain.runtime and its checkpoint manager, small.

Every rank holds the same vector (a replica, as the manager expects of a plain tensor;
per-rank values are issue 12's), and each step adds 1 to it; the manager saves it every
--save-every steps and, on a stop signal, saves the step just finished and leaves with
ctx.exit_for_requeue: at the end it must equal the number of steps, none lost or repeated. A first
start (no checkpoint yet) "prepares data" for --startup-sleep seconds before init(), so a
preemption can catch it before the runtime is there. Rank 0 appends JSON events to --events.
$EXIT_PATH chooses how it leaves after the work (tests/programs/exit_paths.py).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import exit_paths
import hpctrain.runtime


def log(path: str, **event: object) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({**event, "time": time.time()}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--save-every", type=int, default=3)
    ap.add_argument("--ckpt-dir", default=os.environ.get("HPCTRAIN_CKPT_DIR"))
    ap.add_argument("--events", default=os.environ.get("EVENTS"))
    ap.add_argument("--step-sleep", type=float, default=0.5)
    ap.add_argument("--startup-sleep", type=float, default=0.0)
    ap.add_argument("--crash-at-step", type=int, default=-1)
    ap.add_argument("--crash-rank", type=int, default=1)
    args = ap.parse_args()
    exit_paths.arm()

    fresh = not os.path.exists(os.path.join(args.ckpt_dir, "latest"))
    if fresh and args.startup_sleep:
        if os.environ.get("RANK", "0") == "0":
            log(args.events, event="startup")
        time.sleep(args.startup_sleep)
    t_init = time.time()
    import torch
    import torch.distributed

    from hpctrain.checkpoint import CheckpointManager

    ctx = hpctrain.runtime.init()
    ckpt = CheckpointManager(args.ckpt_dir, keep_last=2)
    state = {"w": torch.zeros(1000)}
    start = ckpt.load_latest(state) or 0
    if ctx.is_main:
        log(args.events, event="start", step=start, restart=ctx.restart_count,
            last=ctx.last_exit_cause, t_init=t_init)
    for step in range(start, args.steps):
        ctx.step = step
        if step == args.crash_at_step and ctx.rank == args.crash_rank:
            raise RuntimeError(f"simulated crash at step {step}")
        state["w"] += 1
        exit_paths.at_step(step)
        time.sleep(args.step_sleep)
        if ctx.is_main:
            log(args.events, event="step", step=step)
        if ctx.stop_requested():
            ckpt.save(step + 1, state)
            ckpt.close()
            if ctx.is_main:
                log(args.events, event="stop", step=step + 1, cause=ctx.stop_cause)
            ctx.exit_for_requeue(step + 1)
        if (step + 1) % args.save_every == 0:
            ckpt.save(step + 1, state)
    if ctx.is_main:
        log(args.events, event="end", step=args.steps)
    exit_paths.leave(torch.distributed.barrier)
    ckpt.close()
    if int(state["w"][0]) != args.steps:
        raise RuntimeError(f"rank {ctx.rank}: w={int(state['w'][0])} after {args.steps} steps")
    if ctx.is_main:
        log(args.events, event="done", step=args.steps)
    ctx.close()


if __name__ == "__main__":
    main()
