"""hpctrain for the Hugging Face Trainer: ``Trainer(..., callbacks=[HpctrainCallback()])``.

Run with ``launcher = "torchrun"``. The callback

- reports each optimizer step to the supervisor's watchdog (a hung rank is found and the
  step restarted in the allocation; ``status`` shows the step; ``report`` the goodput and
  the throughput: the Trainer's samples per step, or ``tokens_per_step=`` and the model's
  FLOPs for its MFU);
- on any stop (preemption, the time-limit warning, a ``scancel``: under torchrun every rank
  gets SIGTERM) agrees with the other ranks at the step's end, has the Trainer save its own
  checkpoint of that step (``checkpoint-N`` in ``output_dir``, no evaluation first), and
  leaves once it is saved so that the supervisor requeues;
- works with the process group the Trainer (Accelerate) makes (no second one);
- after a shrink ([elastic] min_nodes: a node lost, no spare left, the job going on on
  fewer nodes) multiplies ``gradient_accumulation_steps`` by ``ctx.accumulation`` when
  the Trainer is made: the global batch of a step stays the same.

The next run resumes with the Trainer's own line::

    from transformers.trainer_utils import get_last_checkpoint
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hpctrain.integrations.session import Session, accumulation

__all__ = ["HpctrainCallback"]


class HpctrainCallback(TrainerCallback):
    """hpctrain's runtime for a Hugging Face ``Trainer`` (see the module's docstring)."""

    def __init__(self, *, tokens_per_step: float | None = None,
                 samples_per_step: float | None = None, flops_per_token: float | None = None,
                 flops_per_sample: float | None = None, params: float | None = None) -> None:
        """What one optimizer step does, every rank's together (``tokens_per_step`` or
        ``samples_per_step``; the model's FLOPs per unit, or its ``params``), for
        ``hpctrain report``'s throughput and MFU; by default the samples the Trainer's
        arguments make a step (batch per device x accumulation x processes)."""
        self._session = Session(tokens_per_step, samples_per_step, flops_per_token,
                                flops_per_sample, params)
        self._stopping = False

    def on_init_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        # at the Trainer's making, before train() sizes its loop from the arguments
        more = accumulation()
        if more > 1:
            args.gradient_accumulation_steps *= more

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self._session.start(samples_per_step=args.per_device_train_batch_size
                            * args.gradient_accumulation_steps * args.world_size)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        self._session.step_begins(state.global_step)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self._session.step_ends():
            # the Trainer saves right after this event; no evaluation before it
            self._stopping = True
            self._session.saving()
            control.should_save = True
            control.should_evaluate = False
            control.should_training_stop = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if self._stopping:
            self._session.leave(state.global_step)
