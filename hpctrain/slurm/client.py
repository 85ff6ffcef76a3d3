"""The one place hpctrain runs SLURM client binaries (sbatch, squeue, sacct, scontrol, ...).

Always an argv list (never a shell string), always a timeout, and failures come back
as typed errors carrying Slurm's own message. Transient controller trouble (timeouts,
"Unable to contact slurm controller") is retried a bounded number of times.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from hpctrain.errors import SlurmError, SlurmNotFound, SlurmTimeout

DEFAULT_TIMEOUT_S = 30.0
# Slurm messages that mean "the request never reached the controller": always safe to retry.
UNREACHED_MARKERS = (
    "Unable to contact slurm controller",
    "Connection refused",
    "Slurm temporarily unable to accept job",
)
# Messages (and our own timeout) after which the controller MAY have acted: retried only
# for idempotent calls (queries, scancel), never for sbatch, which could queue a job twice.
TRANSIENT_MARKERS = (*UNREACHED_MARKERS, "Socket timed out", "Resource temporarily unavailable")


@dataclass(frozen=True)
class Result:
    """What a SLURM binary printed."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def have(binary: str) -> bool:
    """True when a SLURM binary is on PATH."""
    return shutil.which(binary) is not None


def run(argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT_S, retries: int = 2,
        check: bool = True, input: str | None = None,
        env: Mapping[str, str] | None = None, retry_delay_s: float = 1.0,
        idempotent: bool = True, umask: int | None = None) -> Result:
    """Run one SLURM binary and return its output.

    Raises SlurmNotFound when the binary is missing, SlurmTimeout when it does not
    answer within ``timeout`` (after ``retries`` more tries), SlurmError when it
    exits non-zero and ``check`` is set. With ``idempotent=False`` (sbatch) only failures
    that prove the request never arrived are retried. ``umask`` is the child's (sbatch
    hands its umask to the job: Slurm creates the job's log files with it).
    """
    argv = tuple(str(a) for a in argv)
    binary = shutil.which(argv[0])
    if binary is None:
        raise SlurmNotFound(f"no SLURM client on this machine: {argv[0]!r} is not on PATH "
                            "(install slurm-client, or run `hpctrain devcluster up` as root)")
    full_env = None if env is None else {**os.environ, **env}
    attempt = 0
    while True:
        attempt += 1
        try:
            proc = subprocess.run((binary, *argv[1:]), capture_output=True, text=True,
                                  timeout=timeout, input=input, env=full_env,
                                  stdin=None if input is not None else subprocess.DEVNULL,
                                  umask=-1 if umask is None else umask)
        except subprocess.TimeoutExpired:
            if attempt <= retries and idempotent:
                time.sleep(retry_delay_s)
                continue
            raise SlurmTimeout(f"`{' '.join(argv)}` did not answer within {timeout:g}s "
                               f"({attempt} tries): is slurmctld up? (`scontrol ping`)") from None
        result = Result(argv, proc.returncode, proc.stdout, proc.stderr)
        if proc.returncode == 0 or not check:
            return result
        message = (proc.stderr.strip() or proc.stdout.strip() or f"exit code {proc.returncode}")
        markers = TRANSIENT_MARKERS if idempotent else UNREACHED_MARKERS
        if attempt <= retries and any(m in message for m in markers):
            time.sleep(retry_delay_s)
            continue
        raise SlurmError(f"{argv[0]} failed: {message}")
