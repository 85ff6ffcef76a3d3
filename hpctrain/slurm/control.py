"""One job, asked about and acted on: what the job supervisor needs from Slurm.

Every call goes through :func:`hpctrain.slurm.client.run` (argv lists, timeouts, typed
errors). A job is addressed by its *key*: ``123``, or ``120_3`` for an array task, never
the bare id of an array task (Slurm reads the array's own id as every task of it).

What the answers mean is :mod:`hpctrain.slurm.view`'s (pure).
"""

from __future__ import annotations

from hpctrain.errors import SlurmError, SlurmTimeout
from hpctrain.slurm import client
from hpctrain.slurm.parse import parse_kv_records
from hpctrain.slurm.view import JobView, job_view  # noqa: F401 - JobView: callers' type

# Slurm's words for outcomes that are answers, not failures of the call
UNKNOWN_JOB = "Invalid job id"
ALREADY_PENDING = "Job is pending execution"
REQUEUE_DISABLED = "presently disabled"


def show_job(key: str, *, timeout: float = 5.0, retries: int = 0) -> JobView | None:
    """What Slurm says about job ``key`` now; None when Slurm does not know it.

    Raises SlurmTimeout/SlurmError when the controller cannot be asked."""
    try:
        res = client.run(["scontrol", "show", "job", "-o", key], timeout=timeout,
                         retries=retries, retry_delay_s=0.5)
    except SlurmError as exc:
        if UNKNOWN_JOB in str(exc):
            return None
        raise
    found = parse_kv_records(res.stdout)
    return job_view(key, found[0]) if found else None


def run_states(key: str, *, timeout: float = 10.0) -> list[str]:
    """How each run of the job ended so far, oldest first, as sacct saw it (``PREEMPTED``,
    ``NODE_FAIL``, ``REQUEUED``, ...); [] when accounting is not available."""
    try:
        res = client.run(["sacct", "-n", "-X", "-D", "-P", "-j", key, "-o", "State"],
                         timeout=timeout, retries=0)
    except SlurmError:
        return []
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def requeue(key: str, *, timeout: float = 5.0) -> str:
    """``scontrol requeue KEY``: "requeued", or "already" when the job is pending again
    (somebody requeued it first, or an attempt that timed out went through). Raises
    SlurmError with Slurm's words otherwise (the controller is unreachable: retry; requeue
    disabled or job unknown: give up)."""
    try:
        client.run(["scontrol", "requeue", key], timeout=timeout, retries=0)
    except SlurmError as exc:
        if ALREADY_PENDING in str(exc):
            return "already"
        raise
    return "requeued"


def forbid_requeue(key: str, *, timeout: float = 10.0) -> None:
    """``scontrol update jobid=KEY requeue=0``: Slurm will not requeue it (a preemption
    then ends it for good). Used when a requeue limit is reached."""
    client.run(["scontrol", "update", f"jobid={key}", "requeue=0"], timeout=timeout,
               retries=1)


def signal_steps(key: str, signal_name: str, *, timeout: float = 5.0) -> None:
    """Deliver ``signal_name`` to every process of the job's steps, on every node, but not
    to the batch step (``scancel --signal``: srun itself would turn a TERM into a kill)."""
    client.run(["scancel", f"--signal={signal_name}", key], timeout=timeout, retries=0)


def is_unreachable(exc: BaseException) -> bool:
    """Did this error mean the controller could not be asked (try again later)?"""
    return isinstance(exc, SlurmTimeout) or any(m in str(exc) for m in client.TRANSIENT_MARKERS)

