"""How a test program leaves, chosen by ``$EXIT_PATH``: the exit-path matrix
(tests/cluster/test_exit_cluster.py) runs every kind of script through each of these.

  normal           return from main after the work
  sys_exit         ``sys.exit(0)`` right after the work (before any close)
  raise            rank 1 raises after the work; the others wait for it in a barrier
  abort            rank 1 aborts at interpreter exit, after everything else has run: the
                   words torch's gloo group prints, then SIGABRT (a recorded-behaviour
                   stand-in for that abort, which otherwise comes in 1 exit of 4)
  teardown_signal  after the work rank 0 asks Slurm for the job's time-limit warning
                   (``scancel --signal --batch``, as Slurm sends it; first run only) and
                   every rank lingers 2 s in its exit, so the warning comes during it
  requeue          rank 0 asks for the warning at step 2 of the first run: a runtime
                   script saves and leaves with exit_for_requeue, the next run finishes

The three calls a program makes: :func:`arm` at its start (before ``hpctrain.runtime.init``:
an exit handler registered then runs after the runtime's teardown), :func:`at_step` in
every step, :func:`leave` after the work (``barrier``: the program's own collective).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from typing import Callable

PATH = os.environ.get("EXIT_PATH", "normal")
RANK = int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0)


def _abort() -> None:
    sys.stdout.flush()
    sys.stderr.write("terminate called without an active exception\n")
    sys.stderr.flush()
    os.abort()


def _linger() -> None:
    time.sleep(2.0)


def _ask_for_the_warning() -> None:
    """The job's time-limit warning, delivered as Slurm delivers --signal=B:SIG. An array
    task is named ARRAY_TASK: its bare SLURM_JOB_ID can be the array's, i.e. every task."""
    signal = os.environ.get("HPCTRAIN_REQUEUE_SIGNAL", "USR2")
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]
    subprocess.run(["scancel", f"--signal={signal}", "--batch", job], check=True, timeout=30)


def arm() -> None:
    """At the program's start: exit handlers that must run after everything else."""
    if PATH == "abort" and RANK == 1:
        atexit.register(_abort)
    elif PATH == "teardown_signal":
        atexit.register(_linger)


def at_step(step: int) -> None:
    """In every step: the warning mid-run, once (first run only)."""
    if PATH == "requeue" and RANK == 0 and step == 2 and \
            os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        _ask_for_the_warning()


def leave(barrier: Callable[[], object]) -> None:
    """After the work: leave as ``$EXIT_PATH`` says (``normal`` and ``abort`` return)."""
    if PATH == "sys_exit":
        sys.exit(0)
    if PATH == "raise":
        if RANK == 1:
            raise RuntimeError("simulated failure after the last step")
        barrier()   # rank 1 never comes: this fails once its process is gone
    if PATH == "teardown_signal" and RANK == 0 and \
            os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        _ask_for_the_warning()   # once: a requeued run finds the work done and leaves
