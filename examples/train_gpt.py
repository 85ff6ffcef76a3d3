"""Train the tiny GPT as DP, TP, PP or 3D, chosen by the layout env, preemption-safe.

    HPCTRAIN_TP=2 HPCTRAIN_PP=1 torchrun --standalone --nproc_per_node=4 \
        examples/train_gpt.py --steps 200 --ckpt-dir /tmp/ck --log /tmp/loss.jsonl

World = tp * dp * pp (HPCTRAIN_DP may be left unset); ranks are ordered tp fastest,
then dp, then pp. TP is torch DTensor tensor parallelism (column-parallel q/k/v and
fc1, row-parallel o and fc2), PP is torch.distributed.pipelining (GPipe, 2
microbatches), DP averages gradients over the "dp" mesh dimension by hand: one
flat all_reduce per step, which works the same on DTensor shards and plain tensors.

On a stop signal every rank agrees at the next step boundary, saves, and leaves
with the requeue exit code; a requeued run resumes from the checkpoint's step, so
a resumed run computes exactly what an uninterrupted one does. With --inprocess the
loop runs under hpctrain.runtime.run: a crash or a hang the supervisor interrupts starts
the loop again in the same processes, from the newest save or --snapshot-every snapshot.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

import hpctrain.runtime
from common import Faults, StepLog, checkpoints, dump_final_state, parse_args
from tinygpt import GPT, Config, batch_for, keep_stage, loss_fn, param_count

MICROBATCHES = 2


def build(ctx: hpctrain.runtime.Context, cfg: Config,
          seed: int) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)  # every rank builds the same full model, then keeps its part
    model = GPT(cfg)
    if ctx.pp_size > 1:
        keep_stage(model, ctx.pp_rank, ctx.pp_size)
    if ctx.tp_size > 1:
        tensor_parallel(model, ctx.mesh["tp"], cfg)
    # foreach=False: the param list mixes DTensors and plain tensors under TP
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, foreach=False)
    return model, opt


def tensor_parallel(model: GPT, tp_mesh: object, cfg: Config) -> None:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if cfg.n_heads % tp_mesh.size():
        raise SystemExit(f"n_heads={cfg.n_heads} is not divisible by tp={tp_mesh.size()}")
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel(),
            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, plan)


def average_gradients(model: GPT, ctx: hpctrain.runtime.Context) -> None:
    """Mean of gradients over the dp group: one flat all_reduce (deterministic order)."""
    if ctx.dp_size == 1:
        return
    with torch.no_grad():
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                 for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=ctx.group("dp"))
        flat /= ctx.dp_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()


class Stepper:
    """One optimizer step, with or without a pipeline; returns the dp-mean loss."""

    def __init__(self, ctx: hpctrain.runtime.Context, model: GPT, opt: torch.optim.Optimizer,
                 cfg: Config, seed: int) -> None:
        self.ctx, self.model, self.opt, self.cfg, self.seed = ctx, model, opt, cfg, seed
        self.schedule = None
        if ctx.pp_size > 1:
            from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

            stage = PipelineStage(model, ctx.pp_rank, ctx.pp_size, ctx.device,
                                  group=ctx.group("pp"))
            # a shrunk job's rank takes several replicas' batches: as many microbatches more
            self.schedule = ScheduleGPipe(stage, loss_fn=loss_fn,
                                          n_microbatches=MICROBATCHES * ctx.accumulation)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's part of step ``step``'s global batch: its replica's, and after a
        shrink ([elastic] min_nodes) also those of the replicas lost, ``ctx.accumulation``
        in all (full-width replica d + k * dp for k < accumulation): the same global batch,
        and with every part one size, the same mean loss."""
        ctx = self.ctx
        parts = [batch_for(self.cfg, self.seed, step, ctx.dp_rank + k * ctx.dp_size)
                 for k in range(ctx.accumulation)]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])

    def __call__(self, step: int) -> float:
        ctx = self.ctx
        x, y = self.batch(step)
        self.opt.zero_grad(set_to_none=True)
        if self.schedule is None:
            loss = loss_fn(self.model(x), y)
            loss.backward()
            loss = loss.detach()
        else:
            loss = self._pipeline_step(x, y)
        average_gradients(self.model, ctx)
        self.opt.step()
        if ctx.dp_size > 1:
            dist.all_reduce(loss, group=ctx.group("dp"))
            loss /= ctx.dp_size
        return float(loss)

    def _pipeline_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        last = ctx.pp_rank == ctx.pp_size - 1
        losses: list[torch.Tensor] = []
        if ctx.pp_rank == 0:
            self.schedule.step(x)
        elif last:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        # only the last stage knows the loss: sum over pp (the others add 0)
        loss = torch.stack(losses).mean().detach() if last else torch.zeros(())
        dist.all_reduce(loss, group=ctx.group("pp"))
        return loss


def prime_optimizer(model: GPT, opt: torch.optim.Optimizer) -> None:
    """Create Adam's state (a checkpoint can only be loaded into existing keys) so that
    it equals a fresh optimizer's: torch's initialiser takes one lr=0 step, undo its count."""
    get_optimizer_state_dict(model, opt)
    for st in opt.state.values():
        if torch.is_tensor(st.get("step")):
            st["step"].zero_()
        elif "step" in st:
            st["step"] = 0


def state_of(model: GPT, opt: torch.optim.Optimizer) -> dict:
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    if args.inprocess:
        return hpctrain.runtime.run(lambda ctx: train(ctx, args))
    return train(hpctrain.runtime.init(), args)


def train(ctx: hpctrain.runtime.Context, args: argparse.Namespace) -> int:
    """Train until ``args.steps`` from the newest checkpoint (or snapshot)."""
    faults = Faults(args.fault, ctx.rank, ctx.attempt, ctx.restart_count)
    cfg = Config()
    # what a step does, for `hpctrain report`'s throughput and MFU: every data-parallel
    # rank's batch of cfg.seq tokens, through the whole model (before build: it seeds)
    ctx.set_work(tokens=cfg.batch * cfg.seq * ctx.dp_size * ctx.accumulation,
                 params=param_count(cfg))
    model, opt = build(ctx, cfg, args.seed)
    prime_optimizer(model, opt)
    ckpt = checkpoints(args)   # the spec's [checkpoint] dir, keep_last and interval
    state = state_of(model, opt)
    if faults.hit("load-crash"):
        raise RuntimeError("--fault load-crash: simulated failure while the others load")
    # a pipeline stage's state holds its own layers only, and only they are loaded: the
    # other stages' are expected, not worth a line in the job log (docs/checkpoint.md)
    resumed = ckpt.load_latest(state, on_unexpected="ignore" if ctx.pp_size > 1 else "warn")
    if resumed is not None:
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])
    start = resumed or 0
    log = StepLog(args.log, enabled=ctx.is_main)
    log.write(event="start", step=start, restart=ctx.restart_count, attempt=ctx.attempt,
              pid=os.getpid(), last_exit_cause=ctx.last_exit_cause,
              layout=[ctx.tp_size, ctx.dp_size, ctx.pp_size])
    stepper = Stepper(ctx, model, opt, cfg, args.seed)
    for step in range(start, args.steps):
        ctx.step = step  # named in the exit record if this step crashes
        if step == args.crash_at_step:
            raise RuntimeError(f"--crash-at-step {step}: simulated user crash")
        faults.before_step(step)
        loss = stepper(step)
        log.write(step=step, loss=loss, attempt=ctx.attempt)
        done = step + 1
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if ctx.stop_requested():  # collective: all ranks stop after the same step
            ckpt.save(done, state_of(model, opt))
            ckpt.close()  # flush and release the root lock before leaving
            log.write(event="stop", step=done, cause=ctx.stop_cause)
            print(f"hpctrain: rank {ctx.rank} stopping after step {done} ({ctx.stop_cause})",
                  flush=True)
            log.close()
            ctx.exit_for_requeue(done)
        if ckpt.due(done) and done < args.steps:
            state = state_of(model, opt)
            if faults.hit("save-crash", done):
                state["broken"] = lambda: None   # cannot be pickled: the save fails
            ckpt.save(done, state)
        elif args.snapshot_every and done % args.snapshot_every == 0:
            ckpt.snapshot(done, state_of(model, opt))
    ckpt.save(args.steps, state_of(model, opt))
    ckpt.close()
    dump_final_state(args.final_state, ctx.rank, model)
    log.write(event="done", step=args.steps)
    log.close()
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
