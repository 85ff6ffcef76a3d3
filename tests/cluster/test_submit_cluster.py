"""``hpctrain submit`` and the Python API against the real devcluster (2 nodes x 2 fake GPUs),
and submitit's requeue protocol there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import submitit

import hpctrain
from hpctrain import cli
from hpctrain.errors import SlurmError
from hpctrain.slurm import client
from hpctrain.spec.model import JobSpec
from helpers.jobs import isolate
from helpers.slurm import wait_until
from helpers.specs import write_spec

pytestmark = pytest.mark.slurm
# The callables below live in this test module, which imports helpers: the job must be able
# to import both (tests/cluster/ for this module, tests/ for helpers).
HERE = Path(__file__).resolve().parent
TESTS_ON_PATH = {"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}


@pytest.mark.smoke
def test_script_job_on_two_nodes_completes_and_the_submitted_file_is_the_render(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    spec = write_spec(root / "job.toml", name="two-nodes", nodes=2, gpus=2, command=[
        "bash", "-c", "echo rank=$RANK/$WORLD_SIZE node=$SLURMD_NODENAME tp=$HPCTRAIN_TP_RANK"])
    assert cli.main(["render", str(spec), "--set", "layout.tp=2"]) == 0
    rendered = capsys.readouterr().out
    assert cli.main(["submit", str(spec), "--set", "layout.tp=2", "--wait", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["state"] == "COMPLETED"
    assert Path(data["paths"]["submission_file"]).read_text() == rendered
    log = Path(data["paths"]["log"]).read_text()
    for rank, node in ((0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")):
        assert f"rank={rank}/4 node={node}" in log


def test_wait_exits_non_zero_when_the_job_fails(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    spec = write_spec(root / "bad.toml", name="fails", command=["bash", "-c", "exit 3"])
    rc = cli.main(["submit", str(spec), "--wait"])
    out = capsys.readouterr().out
    assert rc != 0 and "ended FAILED" in out
    assert "submitted job" in out and "hpctrain logs" in out
    # no exception to record (the program just exited 3): the supervisor's verdict says so,
    # naming the rank and node srun reported
    job_id = re.search(r"submitted job (\d+)", out).group(1)
    assert cli.main(["status", job_id, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["jobs"][0]
    assert row["cause"] == "user_crash", row
    verdict = row["verdict"]
    assert verdict["why"] == "the training step failed (status 3)", verdict
    assert verdict["rank"] == "0" and verdict["node"] in ("n1", "n2"), verdict
    assert "exited with exit code 3" in verdict["failure"]


def test_slurm_refusal_is_one_readable_error_with_slurms_message(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    spec = write_spec(root / "big.toml", name="too-big", sbatch={"mem-per-cpu": "9000G"})
    assert cli.main(["submit", str(spec)]) == SlurmError.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hpctrain: error: Slurm refused the job:")
    assert "sbatch: error:" in err[0]   # Slurm's own words


def test_submit_cli_does_not_import_torch(cluster, tmp_path: Path) -> None:
    root = isolate(pytest.MonkeyPatch(), tmp_path, shared=True)
    spec = write_spec(root / "j.toml", name="light")
    code = ("import sys; from hpctrain import cli; rc = cli.main(sys.argv[1:]); "
            "print('TORCH', 'torch' in sys.modules); sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, "submit", str(spec), "--json"],
                         capture_output=True, text=True, timeout=60, cwd=root)
    assert res.returncode == 0, res.stderr
    assert "TORCH False" in res.stdout
    job_id = json.loads(res.stdout.splitlines()[0])["job_id"]
    hpctrain.Job.attach(job_id).wait(timeout_s=60)


def ranks_and_coords(tag: str) -> dict[str, str]:
    """Runs on every rank: the distributed environment hpctrain set up."""
    import os
    print(f"{tag} from rank {os.environ['RANK']}", flush=True)
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
            "HPCTRAIN_TP_RANK", "HPCTRAIN_DP_RANK", "HPCTRAIN_PP_RANK", "SLURMD_NODENAME")
    return {k: os.environ[k] for k in keys}


def test_function_job_runs_on_every_rank_with_the_layout(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path, shared=True)
    job = hpctrain.submit_function(ranks_and_coords, "hi", partition="debug", nodes=2,
                                   gpus_per_node=2, layout=hpctrain.Layout(tp=2), time="00:05:00",
                                   env=TESTS_ON_PATH)
    results = job.result(timeout_s=120)
    assert str(job.state) == "COMPLETED"
    assert [r["RANK"] for r in results] == ["0", "1", "2", "3"]
    assert {r["WORLD_SIZE"] for r in results} == {"4"}
    assert {(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in results} == {("n1", results[0]["MASTER_PORT"])}
    assert [(r["HPCTRAIN_DP_RANK"], r["HPCTRAIN_TP_RANK"]) for r in results] == \
        [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert [r["SLURMD_NODENAME"] for r in results] == ["n1", "n1", "n2", "n2"]
    # each rank's output: all of it in the job log, one rank alone with --rank
    assert all(f"hi from rank {r}" in job.logs() for r in range(4))
    assert cli.main(["logs", job.job_id, "--rank", "2"]) == 0
    out = capsys.readouterr().out
    assert "hi from rank 2" in out and "hi from rank 1" not in out


def test_function_error_comes_back_with_its_traceback(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolate(monkeypatch, tmp_path, shared=True)
    job = hpctrain.submit_function(_raises, partition="debug", time="00:05:00", env=TESTS_ON_PATH)
    with pytest.raises(hpctrain.HpctrainError, match="ValueError: bad input 42"):
        job.result(timeout_s=120)
    assert str(job.state) == "FAILED"


def _raises() -> None:
    raise ValueError("bad input 42")


def test_python_submit_of_a_spec(cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    spec = JobSpec.load(write_spec(root / "p.toml", name="api", command=["echo", "from-api"]))
    job = hpctrain.submit(spec.with_overrides({"nodes": 2}))
    info = job.wait(timeout_s=120)
    assert str(info.state) == "COMPLETED" and info.num_nodes == 2
    assert job.logs().count("from-api") == 2
    with pytest.raises(hpctrain.HpctrainError, match="no result"):
        job.result()


# ---- submitit's requeue protocol -------------------------------------------------------
class Counter(submitit.helpers.Checkpointable):
    """Counts to ``steps``; submitit pickles it (with its progress) when checkpointed."""

    def __init__(self) -> None:
        self.step = 0
        self.first_step_of_run: list[int] = []

    def __call__(self, marker: str, steps: int) -> dict[str, object]:
        self.first_step_of_run.append(self.step)
        while self.step < steps:
            self.step += 1
            if self.step == 3:
                Path(marker).write_text("3")
            time.sleep(0.5)
        return {"step": self.step, "runs": self.first_step_of_run,
                "restarts": os.environ.get("SLURM_RESTART_COUNT", "0"), "rank": os.environ["RANK"]}


@pytest.mark.slow   # ~25 s: one requeue, and Slurm holds a requeued job ~6 s
def test_checkpointable_callable_is_checkpointed_requeued_and_resumes(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    marker = root / "at-step-3"
    job = hpctrain.submit_function(Counter(), str(marker), 16, partition="debug", nodes=1,
                                   gpus_per_node=1, time="00:05:00", env=TESTS_ON_PATH)
    wait_until(marker.exists, 60, "step 3")
    # the time-limit signal, as Slurm sends it: USR2 to the batch shell, which passes it on
    client.run(["scancel", "--signal=USR2", "--batch", job.job_id])
    result = job.result(timeout_s=150)
    assert result["step"] == 16 and result["restarts"] == "1"
    runs = result["runs"]
    assert runs[0] == 0 and len(runs) == 2 and 3 <= runs[1] < 16   # resumed, not restarted
    # the batch script's ledger names the cause (sacct alone would say REQUEUED)
    assert job.info().requeues == {"time_limit": 1}


@pytest.mark.parametrize("queued", [True, False])
def test_an_sbatch_that_times_out_is_settled_by_slurms_queue(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queued: bool) -> None:
    """sbatch gives up waiting for a busy controller (a 10,000-point sweep showed it): the
    job may be queued all the same. The real sbatch, behind a wrapper slower than the
    timeout (it queues the job, then keeps the answer back), or one that never reaches
    Slurm: the first is found in Slurm's queue and recorded, the second said not queued."""
    from hpctrain.jobs import executor, index
    root = isolate(monkeypatch, tmp_path, shared=True)
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    real = "/usr/bin/sbatch" if queued else "true"
    (wrapper / "sbatch").write_text(f'#!/bin/bash\n{real} "$@" >/dev/null\nsleep 5\n')
    (wrapper / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper}:{os.environ['PATH']}")
    monkeypatch.setattr(executor, "SBATCH_TIMEOUT_S", 1.0)
    spec = JobSpec.load(write_spec(root / "slow.toml", name="slow", sbatch={"hold": True}))
    if queued:
        job = hpctrain.submit(spec)
        try:
            listed = client.run(["squeue", "-h", "-j", job.job_id, "-o", "%j"]).stdout
            assert listed.strip() == "slow"
            assert index.find(job.job_id) is not None
        finally:
            client.run(["scancel", job.job_id], check=False)
    else:
        with pytest.raises(SlurmError, match="nothing was queued"):
            hpctrain.submit(spec)
