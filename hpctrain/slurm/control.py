"""One job, asked about and acted on (what the job supervisor needs from Slurm), and the
cluster facts a submission needs.

Every call goes through :func:`hpctrain.slurm.client.run` (argv lists, timeouts, typed
errors). A job is addressed by its *key*: ``123``, or ``120_3`` for an array task, never
the bare id of an array task (Slurm reads the array's own id as every task of it).

What the answers mean is :mod:`hpctrain.slurm.view`'s (pure).
"""

from __future__ import annotations

import time

from hpctrain.errors import SlurmError, SlurmTimeout
from hpctrain.slurm import client
from hpctrain.slurm.parse import (parse_kv_records, parse_sacct_parsable2, parse_scontrol_config,
                                  run_ends)
from hpctrain.slurm.view import JobView, job_view  # noqa: F401 - JobView: callers' type

# Slurm's words for outcomes that are answers, not failures of the call
UNKNOWN_JOB = "Invalid job id"
ALREADY_PENDING = "Job is pending execution"


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
        res = client.run(["sacct", "-X", "-D", "-P", "-j", key, "-o", "State,Start,End"],
                         timeout=timeout, retries=0)
    except SlurmError:
        return []
    # (a node given back to Slurm closes a RESIZING row: not a run; seen in CI, where the
    # run that had lost a node to its spare was then counted one row off)
    return run_ends(parse_sacct_parsable2(res.stdout))


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


# ---- in-allocation restarts and bad nodes (the hang watchdog) ----------------------------
def step_ids(key: str, *, timeout: float = 5.0) -> list[str]:
    """The job's running steps other than the batch and extern steps: ``["123.0"]``."""
    res = client.run(["squeue", "-h", "-s", "-j", key, "-o", "%i"], timeout=timeout,
                     retries=1)
    return [s for s in res.stdout.split() if s.rsplit(".", 1)[-1].isdigit()]


def kill_steps(key: str, *, timeout: float = 5.0) -> list[str]:
    """SIGKILL every process of the job's training steps, on every node, never the batch
    step (the supervisor): a hung step cannot stop itself. The steps killed."""
    steps = step_ids(key, timeout=timeout)
    for step in steps:
        client.run(["scancel", "--signal=KILL", step], timeout=timeout, retries=1)
    return steps


def node_states(nodes: list[str], *, timeout: float = 5.0) -> dict[str, str]:
    """Slurm's state of each node: ``{"n1": "ALLOCATED", "n2": "DOWN*"}`` (``*``: not
    responding)."""
    if not nodes:
        return {}
    res = client.run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T"],
                     timeout=timeout, retries=1)
    out = {}
    for line in res.stdout.splitlines():
        name, _, state = line.partition("|")
        if name.strip():
            out[name.strip()] = state.strip().upper()
    return out


def partition_nodes(partition: str, *, timeout: float = 5.0) -> list[str]:
    """Every node of ``partition`` (whatever its state)."""
    res = client.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N"], timeout=timeout,
                     retries=1)
    return sorted(set(res.stdout.split()))


def shrink_job(key: str, nodes: list[str], *, timeout: float = 10.0) -> None:
    """``scontrol update jobid=KEY NodeList=...``: the running job keeps only ``nodes``
    (Slurm releases the others; sacct closes a RESIZING row). Done for a node found lost
    before Slurm marks it DOWN, the job no longer holds it and is not ended NODE_FAIL."""
    client.run(["scontrol", "update", f"jobid={key}", f"NodeList={','.join(nodes)}"],
               timeout=timeout, retries=1)


def set_nodes(key: str, count: int, *, timeout: float = 10.0, tries: int = 3) -> None:
    """``scontrol update jobid=KEY NumNodes=COUNT`` on a job that is pending again: a run
    that gave nodes back (``NodeList=``) leaves the job at its smaller size for the next
    run (seen on the devcluster, Slurm 22.05: requeued with NumNodes=1 of 2); this asks for
    the full size again. Retried as :func:`set_excluded`."""
    _update_pending(["scontrol", "update", f"jobid={key}", f"NumNodes={count}"], timeout,
                    tries)


def set_excluded(key: str, nodes: list[str], *, timeout: float = 10.0, tries: int = 3) -> None:
    """``scontrol update jobid=KEY ExcNodeList=...`` on a job that is pending again (Slurm
    refuses it for a running job). Called from the batch step right after a requeue, it
    may be hit by the requeue's SIGTERM to the batch step's processes: tried again then.
    Until the batch step has ended the requeued job cannot start, so no hold is needed."""
    _update_pending(["scontrol", "update", f"jobid={key}", f"ExcNodeList={','.join(nodes)}"],
                    timeout, tries)


def _update_pending(argv: list[str], timeout: float, tries: int) -> None:
    for attempt in range(1, tries + 1):
        try:
            client.run(argv, timeout=timeout, retries=1)
            return
        except SlurmError as exc:
            if attempt == tries or "exit code -" not in str(exc):   # not killed: Slurm said no
                raise
            time.sleep(1.0)


def run_on_nodes(argv: list[str], nodes: int, *, timeout: float = 60.0,
                 nodelist: list[str] | None = None) -> str:
    """Run ``argv`` once per node of this job's allocation (``nodes`` of them, or those of
    ``nodelist``), beside the running step (``srun --overlap``: from inside the batch
    step); what it printed, failures included."""
    where = [f"--nodelist={','.join(nodelist)}"] if nodelist else []
    res = client.run(["srun", "--overlap", f"--nodes={nodes}", *where, "--ntasks-per-node=1",
                      "--kill-on-bad-exit=0", "--quiet", *argv], timeout=timeout, retries=0,
                     check=False)
    return res.stdout + res.stderr


def probe_node(node: str, *, timeout: float = 30.0, pause_s: float = 1.0) -> str | None:
    """Ask ``node`` of this job's allocation for a step (``srun --overlap -w NODE true``
    from inside the batch step, through the node's slurmd): None when it answered, else
    what srun said (or that it did not answer in time). A dead slurmd fails the launch
    after the cluster's MessageTimeout (11 s on the devcluster); a live node answers in a
    fraction of a second. A failure that never reached the node (the controller did not
    answer) says nothing of the node: it is asked again, ``pause_s`` apart, within
    ``timeout``, and said as the controller's only once that is spent."""
    argv = ["srun", "--overlap", f"--nodelist={node}", "--nodes=1",
            "--ntasks=1", "--kill-on-bad-exit=0", "--quiet", "true"]
    end = time.monotonic() + timeout
    while True:
        try:
            res = client.run(argv, timeout=max(end - time.monotonic(), 1.0), retries=0,
                             check=False)
        except SlurmTimeout:
            return f"no answer within {timeout:.0f} s"
        if res.returncode == 0:
            return None
        said = [line.strip() for line in res.stderr.splitlines() if line.strip()]
        first = said[0] if said else f"srun exited {res.returncode}"
        unreached = any(m in res.stderr for m in client.UNREACHED_MARKERS)
        if not unreached:
            return first
        if time.monotonic() + pause_s >= end:
            return f"the controller did not answer within {timeout:.0f} s ({first})"
        time.sleep(pause_s)


def max_array_size(*, timeout: float = 10.0) -> int:
    """The cluster's MaxArraySize (``scontrol show config``): task indices stay below it."""
    config = parse_scontrol_config(client.run(["scontrol", "show", "config"],
                                              timeout=timeout).stdout)
    value = config.get("MaxArraySize", "1001")
    return int(value) if value.isdigit() else 1001


def queued_from(script: str, *, timeout: float = 30.0, wait_s: float = 2.0) -> str | None:
    """The id of this user's queued job whose batch script is ``script`` (an absolute,
    unique path), else None: the scheduler's word on an sbatch that timed out, which may
    have queued its job all the same. Asked twice, ``wait_s`` apart: the controller may
    still be handling that very request."""
    for attempt in range(2):
        res = client.run(["squeue", "-h", "--me", "-o", "%i|%o"], timeout=timeout,
                         check=False)
        for line in res.stdout.splitlines():
            job, _, command = line.partition("|")
            if command.strip() == script and job.strip():
                return job.strip().split("_", 1)[0]     # an array: 123_[0-9%2] -> 123
        if attempt == 0:
            time.sleep(wait_s)
    return None
