"""The two causes that are not signals, on the real devcluster (2 nodes x 2 fake GPUs,
examples/train_gpt.py as tp=2 x dp=2 under torchrun, submitted with `hpctrain submit`):

- a user crash ends FAILED, is not requeued, and `hpctrain status` names the cause;
- node loss (one emulated node's slurmd and every process it started, killed -9): Slurm
  marks the node down, the job NODE_FAIL and requeues it; it resumes from the last
  periodic checkpoint and finishes with every step in the loss log. Prints the figures.

Node loss changes the shared cluster: run it only when no other job is on the devcluster
(it waits for an empty queue), and the node is always restored (finally) and idle again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs_util import isolate
from slurm_util import sacct_states, squeue_state, wait_done, wait_until
from example_jobs import example_spec, submit_example
from torchrun_util import events, records, steps
from hpctrain.devcluster.cluster import DevCluster
from hpctrain.slurm import client
from hpctrain.watcher import last_checkpoint_step

LOST_NODE = "n2"
SETTLE_S = 5  # let slurmctld finish with the lost run before the node returns


def job_out(root: Path, job: str) -> str:
    path = root / f"job-{job}.out"
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no job output)"


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
def test_user_crash_fails_without_requeue_and_status_names_the_cause(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    job = submit_example(root, example_spec(root, name="rt-crash", total=30, save_every=5,
                                            step_sleep=0.0, time="00:10:00",
                                            extra=("--crash-at-step", "7")))
    state = wait_done(job, 120)
    assert state == "FAILED", job_out(root, job)
    assert sacct_states(job) == ["FAILED"]  # no REQUEUED: a crash is not retried
    assert steps(root / "loss.jsonl") == list(range(7))

    res = subprocess.run([sys.executable, "-m", "hpctrain", "status", job, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    row = json.loads(res.stdout)["jobs"][0]
    assert row["state"] == "FAILED" and row["requeues"] == {}
    assert row["cause"] == "user_crash", row
    assert row["exit_record"]["step"] == "7" and row["exit_record"]["requeue"] == "0"
    assert "simulated user crash" in row["exit_record"]["error"]
    table = subprocess.run([sys.executable, "-m", "hpctrain", "status", job],
                           capture_output=True, text=True, timeout=60).stdout
    assert "user_crash@7 RuntimeError" in table


# ---- node loss ------------------------------------------------------------------------------
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


def lose_node(cluster: DevCluster, node: str, job: str) -> int:
    """Kill the node's slurmd, then -9 its stepds and job processes; returns how many."""
    stepds, procs = node_job_pids(node, job)
    assert procs, f"no process of job {job} on {node}"
    cluster.stop_node(node)
    for pid in [*stepds, *procs]:  # stepds first: nobody reports the tasks' deaths
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(stepds) + len(procs)


def node_state(node: str) -> str:
    return client.run(["sinfo", "-h", "-n", node, "-o", "%T"], check=False).stdout.strip()


def restore_node(cluster: DevCluster, node: str) -> None:
    """Start the node's slurmd and wait until Slurm has it idle again (resume it if
    ReturnToService does not)."""
    cluster.start_node(node)
    deadline = time.monotonic() + 60
    resumed = False
    while time.monotonic() < deadline:
        state = node_state(node)
        if state in ("idle", "mixed", "allocated"):
            return
        if not resumed and time.monotonic() > deadline - 40 and "down" in state:
            client.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
            resumed = True
        time.sleep(1)
    raise AssertionError(f"node {node} did not come back: sinfo says {node_state(node)!r}")


def release_if_held(job: str) -> None:
    """A requeued job waits ~120 s (reason BeginTime) before it may start again; start it now
    (the same as a sysadmin would; keeps the test short)."""
    out = client.run(["squeue", "-h", "-j", job, "-o", "%T %r"], check=False).stdout
    if "PENDING" in out and "BeginTime" in out:
        client.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False)


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
def test_node_loss_requeues_and_resumes_from_the_last_periodic_checkpoint(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    total, every = 40, 10
    log, ckpt = root / "loss.jsonl", root / "ckpt"
    dev = DevCluster()
    # killing n2 under somebody else's job would break their test: wait for a quiet cluster
    wait_until(lambda: not client.run(["squeue", "-h", "-o", "%i"]).stdout.strip(), 300,
               "an empty queue (other tests' jobs to finish)", interval_s=2)
    job = submit_example(root, example_spec(root, name="rt-nodeloss", total=total,
                                            save_every=every, step_sleep=0.4, time="00:10:00"))
    try:
        wait_until(lambda: (last_checkpoint_step(str(ckpt)) or 0) >= every
                   and len(steps(log)) >= every + 2, 120, "a periodic checkpoint + 2 steps")
        killed = lose_node(dev, LOST_NODE, job)
        t_lost = time.time()
        saved = last_checkpoint_step(str(ckpt))  # nothing can save any more: n2 is gone
        last_step = max(steps(log))
        wait_until(lambda: "NODE_FAIL" in sacct_states(job), 90, "Slurm to see NODE_FAIL")
        to_requeue = time.time() - t_lost
        # Slurm requeues it itself (JobRequeue=1 / --requeue): COMPLETING, then PENDING.
        # Bring the node back only once Slurm has settled the lost run: a node returning
        # the instant it was marked DOWN let the next run start while Slurm still counted
        # the old step's resources ("step creation temporarily disabled" for minutes).
        wait_until(lambda: squeue_state(job) == "PENDING", 60,
                   f"job {job} back in the queue after NODE_FAIL")
        wait_until(lambda: "completing" not in node_state("n1"), 30, "n1 done completing")
        time.sleep(SETTLE_S)
        restore_node(dev, LOST_NODE)
        time.sleep(SETTLE_S)
        release_if_held(job)
        state = wait_done(job, 150)
    finally:
        restore_node(dev, LOST_NODE)
        if squeue_state(job):
            client.run(["scancel", job], check=False)
    assert state == "COMPLETED", job_out(root, job)
    history = sacct_states(job)
    assert history[0] == "NODE_FAIL" and history[-1] == "COMPLETED", history
    starts = events(log, "start")
    assert [s["step"] for s in starts] == [0, saved], starts
    assert starts[1]["restart"] == 1 and starts[1]["last_exit_cause"] == "node_fail"
    done = steps(log)
    assert sorted(set(done)) == list(range(total))  # every step present
    rerun = sorted(s for s in set(done) if done.count(s) > 1)
    assert rerun == list(range(saved, last_step + 1))  # exactly the steps after the save
    # status: one node_fail requeue; the surviving ranks' crash record (they died of the
    # lost peers) belongs to the requeued run, so it is not the job's cause
    res = subprocess.run([sys.executable, "-m", "hpctrain", "status", job, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    row = json.loads(res.stdout)["jobs"][0]
    assert row["state"] == "COMPLETED" and row["requeues"] == {"node_fail": 1}, row
    assert row["cause"] is None, row
    resumed_at = next(r["time"] for r in records(log) if r.get("step") == saved
                      and "loss" in r and r["time"] > t_lost)
    print(f"\nfigures: killed {killed} processes on {LOST_NODE}; seconds from node loss to "
          f"requeue (sacct NODE_FAIL) = {to_requeue:.1f}; steps re-run after node loss = "
          f"{len(rerun)} (checkpoint {saved}, last step before loss {last_step}); seconds "
          f"from node loss to first resumed step = {resumed_at - t_lost:.1f}")
