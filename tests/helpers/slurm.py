"""Small helpers for tests that drive the real devcluster (through hpctrain.slurm.client)."""

from __future__ import annotations

import os
import re
import time
from typing import Callable

from hpctrain.slurm import client


def sbatch(*args: str) -> str:
    """Submit with sbatch --parsable; return the job id."""
    return client.run(["sbatch", "--parsable", *args]).stdout.strip().split(";")[0]


def squeue_state(job_id: str) -> str:
    """Current state from squeue ('' once the job has left the queue)."""
    out = client.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout
    return out.strip()


FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}


def sacct_states(job_id: str, settle_s: float = 30.0) -> list[str]:
    """Every state sacct recorded for the job's allocation, oldest first (-D: duplicates).

    A job that has left the queue is read until accounting has its end (at most
    ``settle_s``): slurmdbd records it moments after, later on a busy machine, and a test
    must judge the outcome, not how soon the books caught up (issue 44)."""
    deadline = time.monotonic() + settle_s
    while True:
        out = client.run(["sacct", "-n", "-X", "-P", "-D", "-j", job_id, "-o", "State"]).stdout
        states = [line.split()[0] for line in out.splitlines() if line.strip()]
        if (states and states[-1] in FINAL) or time.monotonic() > deadline \
                or squeue_state(job_id):
            return states
        time.sleep(0.5)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str,
               interval_s: float = 0.5) -> float:
    """Poll ``predicate`` until true; return seconds waited; fail with ``what`` on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")


def wait_done(job_id: str, timeout_s: float = 60.0) -> str:
    """Wait until the job has left the queue and sacct has a final state; return it."""
    final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
    states: list[str] = []

    def done() -> bool:
        nonlocal states
        if squeue_state(job_id):
            return False
        states = sacct_states(job_id)
        return bool(states) and states[-1] in final

    try:
        wait_until(done, timeout_s, f"job {job_id} to finish")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{explain(job_id)}") from None
    return states[-1]


def explain(job_id: str) -> str:
    """What Slurm says about a job that did not finish in time, and about the nodes."""
    parts = []
    for argv in (["scontrol", "show", "job", job_id], ["sacct", "-X", "-D", "-j", job_id,
                                                       "-o", "JobID,State,Start,End,Reason"],
                 ["sinfo", "-N", "-o", "%N %T %E"]):
        res = client.run(argv, check=False, retries=0)
        parts.append(f"$ {' '.join(argv)}\n{res.stdout}{res.stderr}")
    out = re.search(r"\bStdOut=(\S+)", parts[0])
    if out and os.path.isfile(out.group(1)):
        with open(out.group(1), errors="replace") as f:
            parts.append(f"job log {out.group(1)} (end):\n{f.read()[-3000:]}")
    return "\n".join(parts)
