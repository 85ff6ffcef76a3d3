"""A lost node however it dies (issue 42, item 0), on the real devcluster: a plain srun
script that never imports hpctrain (no progress records: only srun's word) loses a node
processes first and moves to the spare; the batch node lost all at once takes the
supervisor along, and Slurm requeues the job, which resumes and completes. The launcher
matrix is tests/cluster/test_node_loss_cluster.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.slurm import client
from helpers import admin
from helpers.cluster import status
from helpers.jobs import isolate
from helpers.nodes import bring_back, lose_node
from helpers.slurm import squeue_state, wait_done, wait_until
from helpers.specs import spec_toml
from helpers.torchrun import events
from helpers.lossjobs import EVERY, PROGRAMS, TOTAL, empty_queue, job_log, loop_spec, \
    step_done, submit

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]


def test_a_plain_script_that_loses_a_node_processes_first_moves_to_the_spare(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """counter.sh never imports hpctrain: no progress record, no last word. srun says
    "task 2: Killed" on n2 and ends the step; n2 answers no step: a lost node."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    dev = admin.Cluster()
    empty_queue()
    log, counts = root / "counter.jsonl", root / "counts"
    total = 30
    spec = spec_toml(
        name="loss-plain", partition="wide", nodes=2, gpus_per_node=2, time="00:10:00",
        output=f"{root}/job-%j.out", workdir=str(root),
        run={"launcher": "srun", "command": ["bash", str(PROGRAMS / "counter.sh"),
                                             str(total), str(counts), str(log), "0.3"]},
        elastic={"spare_nodes": 1}, requeue={"max_requeues": 2, "max_crash_restarts": 0})
    job = submit(root, spec)

    def counted() -> list[int]:
        return [e["step"] for e in events(log, "step")]
    try:
        wait_until(lambda: max(counted(), default=0) >= 5, 180, "5 counted steps")
        lose_node(dev, "n2", job, order="processes-first")
        state = wait_done(job, 240)
    finally:
        dev.make_nodes_usable()
        if squeue_state(job):
            client.run(["scancel", job], check=False)
    out = job_log(root, job)
    assert state == "COMPLETED", out
    # n2 answered while its slurmd still ran (a fault of the node), or no longer (lost):
    # left for the spare either way
    assert ("node n2 did not answer" in out or "node n2 answered a step" in out) and \
        "on n1,n3 (spare: none)" in out, out
    row = status(job)
    assert row["restarts_in_place"] == {"node_fail": 1} and row["requeues"] == {}, row
    assert max(counted()) == total and len(events(log, "done")) == 1, out


def test_the_batch_node_lost_all_at_once_is_requeued_by_slurm_and_resumes(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """n1 hosts the batch step: a power loss takes the supervisor along, so Slurm ends the
    run NODE_FAIL and requeues it (never worse off than plain Slurm); the next run's
    supervisor enters that requeue from accounting, and the job resumes from its
    checkpoint and completes, every step done. (Killed processes first, the batch step's
    stepd would report the batch script's death and Slurm would end the job FAILED itself,
    before the node goes dark: as plain Slurm does. Ranks dying first while the supervisor
    lives is the fake-scheduler cell test_the_batch_node_lost_processes_first_is_requeued.)"""
    root = isolate(monkeypatch, tmp_path, shared=True)
    dev = admin.Cluster()
    empty_queue()
    job = submit(root, loop_spec(root, "srun"))
    try:
        wait_until(lambda: step_done(root, EVERY + 2), 240, f"step {EVERY + 2}")
        lose_node(dev, "n1", job, order="all-at-once")
        wait_until(lambda: squeue_state(job) == "PENDING", 120, "Slurm's requeue")
        bring_back(dev, job)
        state = wait_done(job, 240)
    finally:
        dev.make_nodes_usable()
        if squeue_state(job):
            client.run(["scancel", job], check=False)
    out = job_log(root, job)
    assert state == "COMPLETED", out
    row = status(job)
    assert row["cause"] == "completed" and row["requeues"] == {"node_fail": 1}, row
    starts = events(root / "events.jsonl", "start")
    assert starts[-1]["restart"] == 1 and starts[-1]["step"] >= EVERY, starts
    done = [e["step"] for e in events(root / "events.jsonl", "step")]
    assert sorted(set(done)) == list(range(TOTAL)), done
