"""End-to-end: real jobs on the devcluster (multi-node, GRES, accounting, preemption, requeue)."""

from __future__ import annotations

import getpass
import uuid
from pathlib import Path

import pytest

from helpers.slurm import sacct_states, sbatch, squeue_state, wait_done, wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def outdir(cluster) -> Path:
    d = cluster.shared_dir / f"tests-{getpass.getuser()}" / uuid.uuid4().hex[:8]
    d.mkdir(parents=True)
    return d


def test_two_node_gpu_job_runs_four_tasks_two_per_node(cluster, outdir: Path) -> None:
    script = outdir / "job.sh"
    script.write_text("#!/bin/bash\n"
                      "srun bash -c 'echo \"$SLURM_PROCID $SLURMD_NODENAME\"'\n")
    job = sbatch("--nodes=2", "--ntasks-per-node=2", "--gres=gpu:2",
                 f"--output={outdir}/out.txt", str(script))
    assert wait_done(job) == "COMPLETED"
    lines = sorted((outdir / "out.txt").read_text().split("\n"))
    ranks = [line.split() for line in lines if line.strip()]
    assert sorted(int(r) for r, _ in ranks) == [0, 1, 2, 3]
    per_node = {n: sum(1 for _, m in ranks if m == n) for _, n in ranks}
    assert per_node == {"n1": 2, "n2": 2}
    assert "COMPLETED" in sacct_states(job)


def test_gpu_request_beyond_node_is_refused(cluster) -> None:
    from hpctrain.errors import SlurmError

    with pytest.raises(SlurmError, match="(?i)requested node configuration is not available"):
        sbatch("--nodes=1", "--gres=gpu:3", "--wrap=true")


def test_debug_job_is_preempted_by_urgent_and_requeued(cluster, outdir: Path) -> None:
    log = outdir / "victim.out"
    victim = sbatch("--partition=debug", "--nodes=2", "--ntasks-per-node=4", "--requeue",
                    "--open-mode=append", f"--output={log}",
                    "--wrap=echo start restart=${SLURM_RESTART_COUNT:-0}; sleep 300")
    wait_until(lambda: "restart=0" in (log.read_text() if log.exists() else ""), 30,
               "the debug job to start")
    urgent = sbatch("--partition=urgent", "--nodes=2", "--ntasks-per-node=4",
                    f"--output={outdir}/urgent.out", "--wrap=sleep 1")
    wait_until(lambda: "PREEMPTED" in sacct_states(victim), 60, "sacct to show PREEMPTED")
    # Same job id, back in the queue (PENDING) rather than failed.
    wait_until(lambda: squeue_state(victim) in ("PENDING", "RUNNING"), 30, "the victim requeued")
    assert wait_done(urgent) == "COMPLETED"
    seconds = wait_until(lambda: "restart=1" in log.read_text(), 60,
                         "the requeued job to start again with SLURM_RESTART_COUNT=1")
    # Requeued jobs are released after cred_expire + 1 (6 s), not Slurm's default 2 minutes.
    assert seconds < 40, f"requeued job took {seconds:.0f}s to restart"
    assert "DUE TO PREEMPTION" in log.read_text()
    from hpctrain.slurm import client
    client.run(["scancel", victim])
