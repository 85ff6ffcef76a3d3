"""A data-parallel loop written against hpctrain.runtime: every step all-reduces a
"gradient" (as DDP does) and adds it to a weight vector every rank holds, so after N steps
w == N * world_size exactly, whatever was restarted. Saves every --save-every steps with the
checkpoint manager and resumes from the newest one. Faults are injected per in-place attempt
(HPCTRAIN_STEP_ATTEMPT) so a restarted step runs clean:

  --hang RANK:STEP:ATTEMPT          that rank sleeps forever in that step instead of joining
                                    the all-reduce (the others wait inside theirs)
  --startup-hang RANK:ATTEMPT       that rank sleeps forever before init()
  --crash RANK:STEP:ATTEMPT         that rank raises in that step
  --device-error RANK:STEP:ATTEMPT  that rank raises torch.AcceleratorError, as CUDA's sticky
                                    errors do (a recorded message: there is no GPU here)

Rank 0 appends JSON events to --events (start, step, done). --inprocess runs the loop
under hpctrain.runtime.run: a crash or an interrupted hang restarts it in the same processes.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def log(path: str, **event: object) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({**event, "time": time.time()}) + "\n")


def fault(spec: str | None, rank: int, attempt: int, step: int | None = None) -> bool:
    if not spec:
        return False
    parts = [int(x) for x in spec.split(":")]
    if step is None:
        return parts == [rank, attempt]
    return parts == [rank, step, attempt]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=3)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--events", required=True)
    ap.add_argument("--step-sleep", type=float, default=0.3)
    ap.add_argument("--hang")
    ap.add_argument("--startup-hang")
    ap.add_argument("--crash")
    ap.add_argument("--device-error")
    ap.add_argument("--inprocess", action="store_true",
                    help="run under hpctrain.runtime.run: restarts in these processes")
    args = ap.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("HPCTRAIN_STEP_ATTEMPT", "0"))
    if fault(args.startup_hang, rank, attempt):
        while True:   # never reaches init(): the others wait for it in the rendezvous
            time.sleep(3600)

    import hpctrain.runtime

    if args.inprocess:
        hpctrain.runtime.run(lambda ctx: train(ctx, args))
    else:
        train(hpctrain.runtime.init(), args)


def train(ctx, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager

    attempt = ctx.attempt
    ckpt = CheckpointManager(args.ckpt_dir, keep_last=2)
    state = {"w": torch.zeros(256)}
    start = ckpt.load_latest(state) or 0
    if ctx.is_main:
        log(args.events, event="start", step=start, restart=ctx.restart_count, attempt=attempt,
            last=ctx.last_exit_cause, pid=os.getpid())
    for step in range(start, args.steps):
        ctx.step = step
        if fault(args.crash, ctx.rank, attempt, step):
            raise RuntimeError(f"simulated crash at step {step}")
        if fault(args.device_error, ctx.rank, attempt, step):
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
        if fault(args.hang, ctx.rank, attempt, step):
            while True:   # a rank that never joins: everybody else hangs in all_reduce
                time.sleep(3600)
        grad = torch.ones(256)
        dist.all_reduce(grad)
        state["w"] += grad
        time.sleep(args.step_sleep)
        if ctx.is_main:
            log(args.events, event="step", step=step, attempt=attempt)
        if ctx.stop_requested():
            ckpt.save(step + 1, state)
            ckpt.close()
            ctx.exit_for_requeue(step + 1)
        if (step + 1) % args.save_every == 0:
            ckpt.save(step + 1, state)
    ckpt.close()
    want = args.steps * ctx.world_size
    if int(state["w"][0]) != want:
        raise RuntimeError(f"rank {ctx.rank}: w={int(state['w'][0])}, want {want}")
    if ctx.is_main:
        log(args.events, event="done", step=args.steps, attempt=attempt)
    ctx.close()


if __name__ == "__main__":
    main()
