"""What every integration does around a framework's training loop, framework-free: the
runtime attached to the framework's process group, the step boundaries reported, the stop
agreed at a boundary, and the exit the supervisor requeues.

The watchdog sees a batch as ``training`` and everything between two batches (the
framework's periodic checkpoint, an evaluation, logging) as ``between-steps``, which is
allowed the whole hang timeout: a derived timeout of ten steps' time is meant for steps.
"""

from __future__ import annotations

from typing import NoReturn

from hpctrain.runtime import Context, attach, pace
from hpctrain.runtime.context import BETWEEN_STEPS
from hpctrain.runtime.work import make_work

# the framework wraps its model in DDP before the callback attaches the runtime: DDPs made
# from now on are watched for their own time per step (hpctrain.runtime.pace)
pace.watch_new_ddps()


def accumulation() -> int:
    """The micro-batches a rank takes each step to keep the global batch: 1, but after a
    shrink ([elastic] min_nodes) the full data-parallel width over the one now (read from
    the step's environment: a framework sets its accumulation before it makes its group)."""
    from hpctrain.runtime.environment import Environment

    return Environment.from_env().accumulation


class Session:
    """The runtime's side of one framework's training run (one per process)."""

    def __init__(self, tokens_per_step: float | None = None,
                 samples_per_step: float | None = None, flops_per_token: float | None = None,
                 flops_per_sample: float | None = None, params: float | None = None) -> None:
        """What a step does, as a callback's arguments say (:meth:`Context.set_work
        <hpctrain.runtime.Context.set_work>`; none: not said). Checked now: a wrong value
        fails where the callback is made, not in the job's first step."""
        self.ctx: Context | None = None
        given = {"tokens": tokens_per_step, "samples": samples_per_step,
                 "flops_per_token": flops_per_token, "flops_per_sample": flops_per_sample,
                 "params": params}
        self.work = {k: v for k, v in given.items() if v is not None}
        if self.work:
            make_work(**self.work)

    def start(self, samples_per_step: float | None = None) -> Context:
        """Attach to the framework's process group (once: a second fit reuses it), and
        say what a step does: the callback's arguments, else ``samples_per_step`` (what
        the framework's own settings say, where it knows)."""
        if self.ctx is None:
            self.ctx = attach()
            work = self.work or ({"samples": samples_per_step} if samples_per_step else {})
            if work:
                self.ctx.set_work(**work)
        return self.ctx

    def claim_signals(self) -> None:
        """The stop signals go to hpctrain's flag, not to handlers the framework set since
        (Lightning's SIGTERM handler would end the run without a save)."""
        self.start().flag.claim()

    def step_begins(self, step: int) -> None:
        ctx = self.start()
        ctx.step = step
        if ctx.reporter is not None and ctx.reporter.phase == BETWEEN_STEPS:
            ctx.reporter.set_phase("training")

    def step_ends(self) -> bool:
        """A step boundary, on every rank: True on all ranks when the job must stop (any
        rank got a stop signal). Collective."""
        ctx = self.start()
        stop = ctx.stop_requested()
        if ctx.reporter is not None and not stop:
            ctx.reporter.set_phase(BETWEEN_STEPS)
        return stop

    def saving(self) -> None:
        """The framework's emergency save begins (:meth:`leave` follows it): the watchdog
        allows it the save timeout and ``report`` counts it as saving."""
        ctx = self.start()
        if ctx.reporter is not None:
            ctx.reporter.set_phase("saving")

    def leave(self, step: int) -> NoReturn:
        """After the framework's emergency save, on every rank: the exit the supervisor
        requeues (:meth:`hpctrain.runtime.Context.exit_for_requeue`)."""
        self.start().exit_for_requeue(step)
