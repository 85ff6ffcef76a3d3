"""A Hugging Face Trainer script of the documented shape (TrainingArguments, a model built
from its config, a dataset, ``trainer.train(resume_from_checkpoint=...)``), for the
devcluster tests of hpctrain's transformers integration. Under torchrun, CPU only: a
one-layer GPT-2 from a config and random token ids from a seed, nothing downloaded.

  --mode hpctrain   the Trainer gets hpctrain.integrations.transformers.HpctrainCallback
  --mode plain      hpctrain is never imported

Either way it resumes with the Trainer's own line, from the newest ``checkpoint-N`` in
--out. Rank 0 appends JSON events to --events: ``start`` (the global step it resumed at,
the run, the pid), ``step`` (each finished optimizer step) and ``done``.
  --hang RANK:STEP:RESTART:ATTEMPT   that rank sleeps before that step (the others wait for
                                     it in DDP's gradient all-reduce), on that run and attempt
  --stop-at STEP                     SIGTERM to this process before that step, as Slurm or
                                     torchrun sends it (the unit tests' one-process runs)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time


def log(path: str, **event: object) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({**event, "time": time.time()}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("hpctrain", "plain"), required=True)
    ap.add_argument("--out", required=True, help="the Trainer's output_dir")
    ap.add_argument("--events", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--save-steps", type=int, default=1000)
    ap.add_argument("--step-sleep", type=float, default=0.3)
    ap.add_argument("--hang", default="")
    ap.add_argument("--stop-at", type=int, default=-1)
    args = ap.parse_args()

    import torch
    from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                              TrainingArguments)
    from transformers.trainer_utils import get_last_checkpoint

    rank = int(os.environ.get("RANK", "0"))
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    attempt = int(os.environ.get("HPCTRAIN_STEP_ATTEMPT", "0"))
    hang = [int(x) for x in args.hang.split(":")] if args.hang else None

    class Events(TrainerCallback):
        def on_train_begin(self, targs, state, control, **kw):
            if state.is_world_process_zero:
                log(args.events, event="start", step=state.global_step, restart=restart,
                    attempt=attempt, pid=os.getpid(),
                    accumulation=targs.gradient_accumulation_steps)

        def on_step_begin(self, targs, state, control, **kw):
            if hang and hang[:1] == [rank] and hang[1:] == [state.global_step, restart,
                                                             attempt]:
                while True:        # the others wait in DDP's all-reduce of the gradients
                    time.sleep(3600)
            if state.global_step == args.stop_at:
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(args.step_sleep)

        def on_step_end(self, targs, state, control, **kw):
            if state.is_world_process_zero:
                log(args.events, event="step", step=state.global_step, restart=restart,
                    attempt=attempt)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            gen = torch.Generator().manual_seed(7)
            self.ids = torch.randint(0, 128, (2048, 16), generator=gen)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(11)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32,
                                       n_layer=1, n_head=2))
    targs = TrainingArguments(output_dir=args.out, max_steps=args.steps,
                              per_device_train_batch_size=4, save_steps=args.save_steps,
                              logging_steps=10, report_to="none", use_cpu=True, seed=11,
                              dataloader_num_workers=0, disable_tqdm=True)
    callbacks: list = [Events()]
    if args.mode == "hpctrain":
        from hpctrain.integrations.transformers import HpctrainCallback

        callbacks.append(HpctrainCallback())
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=callbacks)
    # the newest checkpoint-N, None on the first run (output_dir does not exist yet)
    last = get_last_checkpoint(args.out) if os.path.isdir(args.out) else None
    trainer.train(resume_from_checkpoint=last)
    if trainer.is_world_process_zero():
        log(args.events, event="done", step=trainer.state.global_step, restart=restart)


if __name__ == "__main__":
    main()
