"""Train the tiny GPT with DeepSpeed ZeRO-2 (data parallel), preemption-safe.

    DS_ACCELERATOR=cpu torchrun --standalone --nproc_per_node=4 \
        examples/train_deepspeed.py --steps 200 --ckpt-dir /tmp/ck --log-file /tmp/loss.jsonl

On a machine without GPUs the CPU accelerator and gloo are used. ZeRO-2 shards the
optimizer state and gradients over the ranks, so the checkpoint is DeepSpeed's own
(``engine.save_checkpoint``) committed through hpctrain's checkpoint protocol
(``save_deepspeed`` / ``load_deepspeed``): atomic, verified, pruned like any other.
"""

from __future__ import annotations

import os
import sys
import time

import torch

import hpctrain.runtime
from common import StepLog, checkpoints, dump_final_state, parse_args
from hpctrain.checkpoint import load_deepspeed, save_deepspeed
from tinygpt import GPT, Config, batch_for, loss_fn, param_count


def ds_config(cfg: Config) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,  # a plain torch AdamW: no compiled ops on CPU
        "steps_per_print": 10**9,  # our own step log instead of DeepSpeed's
        "wall_clock_breakdown": False,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read when deepspeed is imported
    ctx = hpctrain.runtime.init()  # gloo/nccl process group; DeepSpeed reuses it
    if ctx.tp_size * ctx.pp_size != 1:
        raise SystemExit(f"train_deepspeed.py is data parallel only: got tp={ctx.tp_size}, "
                         f"pp={ctx.pp_size}; unset HPCTRAIN_TP/HPCTRAIN_PP")
    import deepspeed

    cfg = Config()
    # what a step does, for `hpctrain report`'s throughput and MFU (before the seed)
    ctx.set_work(tokens=cfg.batch * cfg.seq * ctx.dp_size, params=param_count(cfg))
    torch.manual_seed(args.seed)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, foreach=False)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(cfg))
    ckpt = checkpoints(args)   # the spec's [checkpoint] dir, keep_last and interval
    resumed, _client = load_deepspeed(ckpt, engine)
    start = resumed or 0
    log = StepLog(args.log, enabled=ctx.is_main)
    log.write(event="start", step=start, restart=ctx.restart_count,
              last_exit_cause=ctx.last_exit_cause, layout=[1, ctx.dp_size, 1])
    for step in range(start, args.steps):
        ctx.step = step  # named in the exit record if this step crashes
        if step == args.crash_at_step:
            raise RuntimeError(f"--crash-at-step {step}: simulated user crash")
        x, y = batch_for(cfg, args.seed, step, ctx.dp_rank)
        loss = loss_fn(engine(x.to(engine.device)), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        log.write(step=step, loss=float(mean) / ctx.world_size)
        done = step + 1
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if ctx.stop_requested():
            save_deepspeed(ckpt, done, engine)
            ckpt.close()
            log.write(event="stop", step=done, cause=ctx.stop_cause)
            log.close()
            print(f"hpctrain: rank {ctx.rank} stopping after step {done} ({ctx.stop_cause})",
                  flush=True)
            ctx.exit_for_requeue(done)
        if ckpt.due(done) and done < args.steps:
            save_deepspeed(ckpt, done, engine)
    save_deepspeed(ckpt, args.steps, engine)
    ckpt.close()
    dump_final_state(args.final_state, ctx.rank, engine.module)
    log.write(event="done", step=args.steps)
    log.close()
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
