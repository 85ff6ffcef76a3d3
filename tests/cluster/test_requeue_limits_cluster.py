"""Per-cause requeue limits on the real devcluster: the batch script's ledger, Slurm's own
requeues, and the message that names the limit (docs/fault-recovery.md, "Requeue budget").

Small one-node jobs (a shell loop under srun, no torch): what is tested is the batch
script and Slurm, which do not care what trains.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from hpctrain.slurm import client
from helpers import admin
from helpers.jobs import isolate
from helpers.nodes import bring_back, lose_node, report_down
from helpers.slurm import sacct_states, sbatch, squeue_state, wait_done, wait_until
from helpers.specs import write_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
NODE = "n2"


def submit(root: Path, requeue: dict[str, int]) -> str:
    """A 1-node job pinned to n2 that prints `running` and sleeps, with ``requeue`` limits."""
    loop = "echo running restart=${SLURM_RESTART_COUNT:-0}; sleep 300"
    spec = write_spec(root / "job.toml", name="limits", partition="debug",
                      command=["bash", "-c", loop], output=f"{root}/job-%j.out",
                      sbatch={"nodelist": NODE}, requeue=requeue)
    res = subprocess.run([sys.executable, "-m", "hpctrain", "submit", str(spec), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["job_id"]


def out(root: Path, job: str) -> str:
    path = root / f"job-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def status(job: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "hpctrain", "status", job, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["jobs"][0]


def interrupt_two_runs(root: Path, job: str, interrupt: Callable[[], object]) -> str:
    """Call ``interrupt`` once run 0 of ``job`` runs and again once run 1 does; return the
    job's final state (conftest cancels the job if this fails half-way)."""
    for restart in (0, 1):
        wait_until(lambda: f"running restart={restart}" in out(root, job), 120,
                   f"run {restart} of job {job}")
        interrupt()
    return wait_done(job, 120)


def test_a_preemption_past_max_preemptions_ends_the_job_and_says_which_limit(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_preemptions=1: the first preemption requeues, the second ends the job even
    though PreemptMode=REQUEUE would requeue it (the script clears its Requeue flag)."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    job = submit(root, {"max_preemptions": 1})

    def preempt() -> None:
        urgent = sbatch("-p", "urgent", f"--nodelist={NODE}", "--gres=gpu:2",
                        f"--output={root}/urgent-%j.out", "--wrap", "sleep 1")
        assert wait_done(urgent, 120) == "COMPLETED"
    state = interrupt_two_runs(root, job, preempt)
    text = out(root, job)
    assert "preemption requeue 1 of max_preemptions=1" in text
    assert ("not requeueing job " + job + " after a preemption: max_preemptions=1 reached "
            "(this is preemption requeue 2)") in text
    assert "running restart=2" not in text and state != "COMPLETED"
    assert sacct_states(job)[0] == "REQUEUED" and len(sacct_states(job)) == 2
    row = status(job)
    assert row["requeues"] == {"preemption": 1}, row
    assert row["requeue_limit"] == "max_preemptions=1", row


def test_a_time_limit_warning_past_max_time_limits_ends_the_job(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_time_limits=1: the first time-limit warning (the requeue signal, as Slurm sends
    it --signal=B:USR2@... before the limit) requeues, the second ends the job."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    job = submit(root, {"max_time_limits": 1})
    state = interrupt_two_runs(
        root, job, lambda: client.run(["scancel", "--signal=USR2", "--batch", job]))
    text = out(root, job)
    assert "time_limit requeue 1 of max_time_limits=1" in text
    assert ("not requeueing job " + job + " after a time_limit: max_time_limits=1 reached "
            "(this is time_limit requeue 2)") in text
    assert "running restart=2" not in text and state == "FAILED"
    assert sacct_states(job) == ["REQUEUED", "FAILED"]
    row = status(job)
    assert row["requeues"] == {"time_limit": 1}, row
    assert row["requeue_limit"] == "max_time_limits=1", row


def test_a_node_failure_past_max_node_failures_does_not_run_again(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node under the job is lost (slurmd, slurmstepds and the job's processes killed)
    and reported DOWN: Slurm ends the run NODE_FAIL and requeues the job on its own. With
    max_node_failures=0 the next run enters that requeue in the ledger, refuses to start
    the training, and the job ends FAILED.

    The node really goes: reported DOWN with its slurmstepd alive, Slurm may start the
    requeued run there before the old batch step has ended, refuse it ("Duplicate jobid")
    and drain the node."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    job = submit(root, {"max_node_failures": 0})
    dev = admin.Cluster()  # should this fail half-way, conftest cancels the job, restores n2
    wait_until(lambda: "running restart=0" in out(root, job), 120, f"job {job} to run")
    lose_node(dev, NODE, job)
    report_down(NODE)
    wait_until(lambda: "NODE_FAIL" in sacct_states(job), 60, "Slurm to see NODE_FAIL")
    wait_until(lambda: squeue_state(job) == "PENDING", 60, f"job {job} back in the queue")
    bring_back(dev, job)
    state = wait_done(job, 120)
    text = out(root, job)
    assert state == "FAILED", text
    assert sacct_states(job) == ["NODE_FAIL", "FAILED"]
    assert ("not running job " + job + " again after a node_fail requeue: max_node_failures=0 "
            "reached (this is node_fail requeue 1)") in text
    assert "running restart=1" not in text
    row = status(job)
    assert row["requeues"] == {"node_fail": 1} and row["requeue_limit"] == "max_node_failures=0"
    table = subprocess.run([sys.executable, "-m", "hpctrain", "status", job],
                           capture_output=True, text=True, timeout=60).stdout
    assert "requeue limit max_node_failures=0 reached" in table
