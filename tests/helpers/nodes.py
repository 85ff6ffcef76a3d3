"""Losing an emulated devcluster node for real, and getting it back (:func:`bring_back`).

Killing a node = its slurmd and (kill -9) the slurmstepds and job processes it started,
found through /proc (the emulated nodes share this machine's process table), in one of the
orders real losses come in (:data:`ORDERS`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


from hpctrain.slurm import client
from helpers import admin
from helpers.slurm import wait_until

LOST_NODE = "n2"
SETTLE_S = 5  # let slurmctld finish with the lost run before the node returns
REASON = "hpctrain-test-node-lost"


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def node_job_pids(node: str, job: str) -> tuple[set[int], set[int]]:
    """(slurmstepds, job processes) the emulated ``node`` runs for ``job``: processes whose
    environment says SLURMD_NODENAME=node and SLURM_JOB_ID=job, and their slurmstepd
    ancestors (a stepd's own environment is the slurmd's, so find it through its child)."""
    want = {f"SLURMD_NODENAME={node}".encode(), f"SLURM_JOB_ID={job}".encode()}
    procs = {int(p) for p in os.listdir("/proc") if p.isdigit()
             and want <= set(_environ(int(p)))}
    stepds = set()
    for pid in procs:
        up = _ppid(pid)
        while up > 1:
            if _comm(up) == "slurmstepd":
                stepds.add(up)
            up = _ppid(up)
    return stepds, procs - stepds


# How a node dies, as real losses come:
#   silent-first     the node goes dark, then its processes die unseen: slurmd, then the
#                    stepds, then the job's processes (nobody reports the tasks' deaths)
#   processes-first  a GPU falling off the bus: the job's processes die, their stepd
#                    reports it ("task 1: Killed", srun ends the step at once), and once
#                    srun has ended the step (STEPD_LINGER_S) the node goes dark: slurmd,
#                    then the stepds
#   processes-only   the driver (or an admin's kill -9) ends the job's processes and the
#                    node stays up: its slurmd answers, its stepds report the deaths
#   all-at-once      a power loss: slurmd, stepds and processes in one kill
ORDERS = ("silent-first", "processes-first", "processes-only", "all-at-once")
STEPD_LINGER_S = 3.0


def lose_node(cluster: admin.Cluster, node: str, job: str, order: str = "silent-first") -> int:
    """Kill the node's part of the job (its slurmd, stepds and job processes, -9) in
    ``order`` (:data:`ORDERS`); returns how many processes of the job it killed."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: one of {ORDERS}")
    stepds, procs = node_job_pids(node, job)
    assert procs, f"no process of job {job} on {node}"

    def kill(pids: set[int] | list[int]) -> None:
        # (they are root's: the operator's kill; some may be gone already: kill's exit
        # status is not checked)
        admin.run(["kill", "-9", *map(str, pids)], check=False)

    if order == "all-at-once":
        slurmd = cluster.local.daemon_pid(f"slurmd-{node}")
        kill([*stepds, *procs, *([slurmd] if slurmd else [])])
    elif order == "silent-first":
        cluster.stop_daemon(f"slurmd-{node}")
        kill(stepds)
        kill(procs)
    else:
        kill(procs)
        if order == "processes-first":
            time.sleep(STEPD_LINGER_S)   # the stepd tells srun, which ends the step
            cluster.stop_daemon(f"slurmd-{node}")
            kill(stepds)
    return len(stepds) + len(procs)


def node_state(node: str) -> str:
    return client.run(["sinfo", "-h", "-n", node, "-o", "%T"], check=False).stdout.strip()


def report_down(node: str) -> None:
    """Tell Slurm the node is gone now (what a site's health check does), instead of
    waiting for SlurmdTimeout; Slurm then ends the job's run NODE_FAIL at once."""
    admin.run(["scontrol", "update", f"nodename={node}", "state=down", f"reason={REASON}"])


def bring_back(cluster: admin.Cluster, job: str) -> None:
    """Return the lost node to service while the requeued ``job`` is held, then release it.

    A node that comes back the instant the job is eligible again got the job started on it
    within a second of its slurmd registering, and once (in CI) that run's ``srun`` then
    waited 4 minutes in "step creation temporarily disabled (Requested nodes are busy)".
    A replaced node does not return within seconds; holding the job until the node is
    usable again (responding, not DOWN) keeps the test to that real order."""
    client.run(["scontrol", "hold", job])
    try:
        time.sleep(SETTLE_S)
        cluster.make_nodes_usable()  # slurmd started, node resumed, responding
        time.sleep(SETTLE_S)         # a ping round: Slurm has heard from it again
        waited = _wait_no_pending_rpcs()
        print(f"bring_back: {waited:.0f} s until slurmctld had no RPC pending for a node")
    finally:
        client.run(["scontrol", "release", job], check=False)


def _wait_no_pending_rpcs(timeout_s: float = 150) -> float:
    """Seconds until slurmctld has no RPC queued for a node (``sdiag``'s pending RPCs);
    the test fails after ``timeout_s`` rather than let the job run into a stale signal.

    Killing the node under a running step leaves a REQUEST_SIGNAL_TASKS for it in
    slurmctld's retry list (seen with sdiag), re-sent only when its last try is
    RPC_RETRY_INTERVAL (60 s) old, so up to a minute after the node answers again. The
    requeued run has the same job id and starts its steps at the same step ids: let it
    onto the node before that signal is delivered and the signal ends the new run (in a
    full run: the requeued run's agent on n2 got a SIGTERM 33 s in that no daemon
    logged). A real node returns after minutes, by which time the signal is gone."""
    def none_pending() -> bool:
        out = client.run(["sdiag"], check=False).stdout
        return "No pending RPCs" in out or "Pending RPC" not in out
    return wait_until(none_pending, timeout_s, "slurmctld to deliver its pending RPCs "
                      "(sdiag) before the requeued job may start", interval_s=1)
