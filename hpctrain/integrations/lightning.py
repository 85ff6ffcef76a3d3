"""hpctrain for PyTorch Lightning: ``Trainer(..., callbacks=[HpctrainCallback()])``.

Run with ``launcher = "srun"`` (one task per device, as Lightning's SLURM environment
expects). The callback

- reports each optimizer step to the supervisor's watchdog (a hung rank is found and the
  step restarted in the allocation; ``status`` shows the step; ``report`` the goodput, and
  the throughput and MFU given ``tokens_per_step=`` or ``samples_per_step=``);
- on any stop (preemption, the time-limit warning, a ``scancel``) agrees with the other
  ranks at the next batch's end, saves Lightning's own checkpoint of that step where
  Lightning's SLURM requeue saves it (``hpc_ckpt_N.ckpt`` in ``default_root_dir``, also
  linked as ``last.ckpt`` for each ``ModelCheckpoint(save_last=True)``), and leaves so the
  supervisor requeues. Lightning's own SIGTERM handling and auto-requeue are bypassed:
  hpctrain requeues, knowing from Slurm why the job stopped;
- works with the process group Lightning makes (no second one);
- after a shrink ([elastic] min_nodes: a node lost, no spare left, the job going on on
  fewer nodes) multiplies ``accumulate_grad_batches`` by ``ctx.accumulation``: with
  Lightning's distributed sampler each rank sees more batches, and the global batch of
  an optimizer step stays the same.

The next run resumes with Lightning's own line: ``trainer.fit(model)`` loads the newest
HPC checkpoint by itself under SLURM; ``trainer.fit(model, ckpt_path="last")`` loads the
linked ``last.ckpt``.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

from hpctrain.integrations.session import Session, accumulation

__all__ = ["HpctrainCallback"]


class HpctrainCallback(Callback):
    """hpctrain's runtime for a Lightning ``Trainer`` (see the module's docstring)."""

    def __init__(self, *, tokens_per_step: float | None = None,
                 samples_per_step: float | None = None, flops_per_token: float | None = None,
                 flops_per_sample: float | None = None, params: float | None = None) -> None:
        """What one optimizer step does, every rank's together (``tokens_per_step`` or
        ``samples_per_step``; the model's FLOPs per unit, or its ``params``): ``hpctrain
        report`` measures throughput, MFU and cost from it (``Context.set_work``)."""
        self._session = Session(tokens_per_step, samples_per_step, flops_per_token,
                                flops_per_sample, params)
        self._accumulated = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._session.start()
            more = accumulation()
            if more > 1 and not self._accumulated:      # (a second fit: applied already)
                self._accumulated = True
                trainer.accumulate_grad_batches *= more

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after the Trainer set its own signal handlers (Trainer._run)
        self._session.claim_signals()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._session.step_begins(trainer.global_step)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._session.step_ends():
            self._session.saving()
            emergency_save(trainer)
            self._session.leave(trainer.global_step)


def emergency_save(trainer: pl.Trainer) -> str:
    """Lightning's checkpoint of the step just done, on every rank (the strategy writes and
    waits for all), where Lightning's SLURM requeue would save it; linked as ``last.ckpt``
    for each ModelCheckpoint that keeps one. Its path."""
    path = _CheckpointConnector.hpc_save_path(trainer.default_root_dir)
    trainer.save_checkpoint(path)
    if trainer.is_global_zero:
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.save_last and cb.dirpath:
                last = os.path.join(cb.dirpath, cb.CHECKPOINT_NAME_LAST + cb.FILE_EXTENSION)
                _link(path, last)
    trainer.strategy.barrier("hpctrain.emergency_save")
    return path


def _link(source: str, target: str) -> None:
    """``target`` becomes ``source``'s file (a hard link, or a copy across file systems),
    replacing what was there in one rename."""
    import shutil

    tmp = f"{target}.hpctrain-tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
