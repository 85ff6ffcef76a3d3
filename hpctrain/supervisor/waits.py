"""Every wait inside the supervisor's step loop, in one shape (:meth:`Waiter.until`): one
deadline; the stop signals that come meanwhile passed on at once (the supervisor's
``pump``: a preemption's grace time is never spent waiting for ranks, stacks or words);
over as soon as what it waits for holds, or the step has ended (nothing more will come).

The waits: ranks arriving to restart in place (``ARRIVE_S``, :mod:`.inprocess`), their
stacks for a hang (:mod:`.response`), the other ranks' failures settling after the first
(:mod:`.response`), the ranks' last words after the step ended (:mod:`.gather`).
"""

from __future__ import annotations

from collections.abc import Callable

from hpctrain.supervisor.scheduler import Scheduler, StepProcess


class Waiter:
    """Waits with the supervisor's clock (a test's fake one) and its signal pump."""

    def __init__(self, slurm: Scheduler, pump: Callable[[], None] = lambda: None) -> None:
        self.slurm, self.pump = slurm, pump

    def until(self, done: Callable[[], bool], seconds: float, every: float,
              step: StepProcess | None = None) -> bool:
        """Look every ``every`` s until ``done()`` (True); False once ``seconds`` have passed
        or ``step`` has ended first. Signals are taken between looks."""
        end = self.slurm.monotonic() + seconds
        while True:
            if step is not None and step.poll() is not None:
                return False
            if done():
                return True
            if self.slurm.monotonic() >= end:
                return False
            self.pump()
            self.slurm.sleep(every)
