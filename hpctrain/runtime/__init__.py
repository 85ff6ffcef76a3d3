"""In-job runtime: where am I, should I stop, how do I leave so the job requeues, and how
a failed attempt starts again in the same processes (:func:`run`).

    ctx = hpctrain.runtime.init()
    for step in range(start, steps):
        train_step(...)
        if ctx.stop_requested():          # collective: every rank agrees
            ckpt.save(step + 1, state); ckpt.wait()
            ctx.exit_for_requeue(step + 1)

Runs inside the job: imports nothing from submission code (hpctrain.slurm, .render,
.spec, .submission, submitit); tests/unit/test_architecture.py enforces it. Importing
this package does not import torch; :func:`init` does.
"""

from __future__ import annotations

from hpctrain.runtime.causes import (
    CAUSES,
    EXIT_COMPLETED,
    EXIT_REQUEUE_PREEMPTION,
    EXIT_REQUEUE_TIME_LIMIT,
    REQUEUE_EXIT_CODES,
    ExitCause,
    cause_of_exit_code,
)
from hpctrain.runtime.context import Context, attach, init
from hpctrain.runtime.environment import Environment, rank_to_coords
from hpctrain.runtime.restart import Interrupted, run

__all__ = ["CAUSES", "EXIT_COMPLETED", "EXIT_REQUEUE_PREEMPTION", "EXIT_REQUEUE_TIME_LIMIT",
           "REQUEUE_EXIT_CODES", "Context", "Environment", "ExitCause", "Interrupted",
           "attach", "cause_of_exit_code", "init", "rank_to_coords", "run"]
