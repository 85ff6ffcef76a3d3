"""``hpctrain status``, ``cancel`` and ``logs --follow`` against the real devcluster; status
of a job Slurm does not know, from the verdict and ledger in its state directory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain import cli, protocol
from hpctrain.errors import JobError
from hpctrain.jobs import index, poll
from hpctrain.jobs.handle import Job
from hpctrain.jobs.index import JobEntry
from hpctrain.protocol import write_record
from hpctrain.slurm import client
from helpers.jobs import LEDGER_LINES, env_without, isolate
from helpers.slurm import sbatch, wait_until
from helpers.specs import write_spec

pytestmark = pytest.mark.slurm
LOOP = ["bash", "-c", "for i in $(seq 1 {n}); do echo tick $i; sleep {s}; done"]


def _submit(spec: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["submit", str(spec), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["job_id"]


def _status(capsys: pytest.CaptureFixture[str], *ids: str) -> dict:
    assert cli.main(["status", *ids, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow   # ~35 s: GraceTime (10 s) plus the requeue hold (10 s)
def test_preempted_job_shows_preemption_and_requeue_not_failure(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    # The step ignores SIGTERM (as a training process does while it checkpoints), so it
    # is still running when Slurm's GraceTime ends and Slurm requeues the job itself.
    cmd = ["bash", "-c", "trap '' TERM; " + LOOP[2].format(n=240, s=0.5)]
    job_id = _submit(write_spec(root / "victim.toml", name="victim", nodes=2, gpus=2,
                                command=cmd), capsys)
    wait_until(lambda: _status(capsys, job_id)["jobs"][0]["state"] == "RUNNING", 60, "RUNNING")
    urgent = sbatch("--partition=urgent", "--nodes=2", "--gres=gpu:2", "--time=1",
                    "--output=/dev/null", "--wrap", "sleep 1")
    seen: set[str] = set()

    def preempted_and_counted() -> bool:
        row = _status(capsys, job_id)["jobs"][0]
        seen.add(row["state"])
        return row["requeues"].get("preemption", 0) >= 1
    try:
        wait_until(preempted_and_counted, 90, "the preemption to be counted")
        assert seen & {"PREEMPTED", "REQUEUED"}, seen
        assert "FAILED" not in seen
        assert cli.main(["status", job_id]) == 0
        table = capsys.readouterr().out
        assert "preemption:1" in table and "victim" in table
    finally:
        assert cli.main(["cancel", job_id, urgent]) == 0


def test_cancel_ends_a_running_job(cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    job_id = _submit(write_spec(root / "c.toml", name="to-cancel",
                                command=[a.format(n=120, s=0.5) for a in LOOP]), capsys)
    job = Job.attach(job_id)
    wait_until(lambda: str(job.state) == "RUNNING", 60, "RUNNING")
    assert cli.main(["cancel", job_id]) == 0
    assert f"cancelled {job_id}" in capsys.readouterr().out
    assert str(job.wait(timeout_s=60).state) == "CANCELLED"
    # issue 43: scancel exits 0 and says nothing of an id it does not know; hpctrain asks
    # Slurm's queue and accounting instead, and never says "cancelled" for a typo
    assert cli.main(["cancel", job_id]) == 0
    assert capsys.readouterr().out.strip() == f"already ended: {job_id}"
    assert cli.main(["cancel", "99999999", job_id]) == JobError.exit_code
    out, err = capsys.readouterr()
    assert "cancelled" not in out and "no such job: 99999999: Slurm has neither queued it" \
        in err, (out, err)


def test_logs_follow_streams_a_running_job(cluster, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    job_id = _submit(write_spec(root / "f.toml", name="follow",
                                command=[a.format(n=12, s=0.5) for a in LOOP]), capsys)
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", "logs", job_id, "--follow"],
                            stdout=subprocess.PIPE, text=True, cwd=root)
    arrivals: dict[str, float] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("tick"):
            arrivals[line.strip()] = time.monotonic()
    assert proc.wait(timeout=60) == 0   # --follow ends by itself when the job ends
    assert list(arrivals) == [f"tick {i}" for i in range(1, 13)]
    # streamed while running: the ticks arrived spread over the job's ~6 s, not at once
    # (a follower slow to start on a loaded machine reads the first few ticks together)
    assert arrivals["tick 12"] - arrivals["tick 1"] > 2.0


def test_status_of_100_jobs_is_one_sacct_call(cluster, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    # 100 real jobs without flooding the cluster: one held array of 100 tasks
    array = sbatch("--hold", "--array=0-99", "--output=/dev/null", "--wrap", "true")
    ids = [f"{array}_{i}" for i in range(100)]
    try:
        # slurmctld hands new jobs to the accounting database within a moment
        wait_until(lambda: client.run(["sacct", "-n", "-X", "-j", array]).stdout.strip() != "",
                   30, "sacct to know the array")
        snap = poll.snapshot(ids)
        assert snap.calls == 1 and snap.source == "sacct"
        assert [snap.get(i).state.name for i in ids] == ["PENDING"] * 100
        data = _status(capsys, *ids)
        assert data["slurm_calls"] == 1 and len(data["jobs"]) == 100
    finally:
        client.run(["scancel", array])


def test_without_sacct_status_falls_back_to_squeue_and_says_so(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    held = sbatch("--hold", "--output=/dev/null", "--wrap", "true")
    monkeypatch.setenv("PATH", env_without("sacct", tmp_path)["PATH"])
    try:
        data = _status(capsys, held)
        assert data["source"] == "squeue" and "sacct" in data["note"]
        assert data["jobs"][0]["state"] == "PENDING"
        assert cli.main(["status", held]) == 0
        assert "note: sacct is not installed here" in capsys.readouterr().err
    finally:
        client.run(["scancel", held])
    wait_until(lambda: held not in poll.queued_ids([held]), 30, "the job to leave squeue")
    assert _status(capsys, held)["jobs"][0]["state"] == "ENDED"


# ---- a job Slurm does not know: status reads its state directory ------------------------
def test_status_shows_the_crash_cause_of_a_recorded_job(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The real Slurm does not know this id (state UNKNOWN, one cheap poll); the cause comes
    from the supervisor's verdict in the checkpoint dir's state directory, in the table and
    in --json."""
    root = isolate(monkeypatch, tmp_path)
    ckpt = root / "ckpt"
    index.append([JobEntry(job_id="31337", name="crashy", kind="script",
                              folder=str(root), checkpoint_dir=str(ckpt))])
    write_record(protocol.state_dir(ckpt, "31337") / protocol.OUTCOME, {
        "cause": "user_crash", "action": "finish", "step": 7, "rank": 0, "node": "n1",
        "error": "RuntimeError: --crash-at-step 7: simulated user crash"})
    assert cli.main(["status", "31337", "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["jobs"][0]
    assert job["cause"] == "user_crash" and job["verdict"]["step"] == "7"
    assert cli.main(["status", "31337"]) == 0
    table = capsys.readouterr().out
    assert "CAUSE" in table.splitlines()[0]
    assert "user_crash@7 RuntimeError" in table


def test_status_shows_requeues_by_cause_and_the_limit_that_ended_the_job(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Slurm does not know this id (one cheap poll, no history): the ledger in the job's
    state directory gives the requeues by cause and names the limit, in the table and --json."""
    root = isolate(monkeypatch, tmp_path)
    ckpt = root / "ckpt"
    protocol.state_dir(ckpt, "31338").mkdir(parents=True)
    (protocol.state_dir(ckpt, "31338") / "ledger").write_text(LEDGER_LINES)
    index.append([JobEntry(job_id="31338", name="preempted-a-lot", kind="script",
                              folder=str(root), checkpoint_dir=str(ckpt))])
    assert cli.main(["status", "31338", "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["jobs"][0]
    assert job["requeues"] == {"preemption": 2, "node_fail": 1}
    assert job["requeue_limit"] == "max_preemptions=2"
    assert cli.main(["status", "31338"]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert "node_fail:1 preemption:2" in row and "requeue limit max_preemptions=2 reached" in row
