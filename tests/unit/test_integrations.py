"""hpctrain.integrations with the real frameworks, one process each, no Slurm: a stop
signal (SIGTERM, as Slurm sends it on a preemption) in the middle of training makes the
callback save the framework's own checkpoint of that step and leave with the exit code the
supervisor requeues; the next run resumes there with the framework's own resume line. The
devcluster runs them across 2 nodes x 2 ranks with the real supervisor
(tests/cluster/test_frameworks_cluster.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import protocol as p
from hpctrain.protocol.progress import Work
from hpctrain.runtime import EXIT_REQUEUE_PREEMPTION

pytestmark = [pytest.mark.torch, pytest.mark.slow]
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
# one srun task, as Lightning's SLURM environment reads it (its auto-resume needs SLURM)
ONE_TASK = {"SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NUM_NODES": "1",
            "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
            "SLURM_NODELIST": "localhost", "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "unit"}
FAST = ("--mode", "hpctrain", "--step-sleep", "0")


def run(program: str, tmp_path: Path, *args: str, extra: dict[str, str] | None = None
        ) -> tuple[int, str, list[dict]]:
    """One run of ``program`` as the supervisor starts a rank: its exit code, its output,
    the events so far."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCTRAIN_"))}
    env.update({"OMP_NUM_THREADS": "1", p.STATE_DIR: str(state), p.EXIT_FILE: str(state / "exit"),
                "HPCTRAIN_RUN_ID": "r1", **(extra or {})})
    events = tmp_path / "events.jsonl"
    proc = subprocess.run([sys.executable, str(PROGRAMS / program), "--events", str(events),
                           *args],
                          env=env, capture_output=True, text=True, timeout=300)
    found = [json.loads(x) for x in events.read_text().splitlines()] if events.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, found


@pytest.mark.lightning
def test_lightning_saves_its_own_checkpoint_on_a_stop_and_resumes_there(tmp_path: Path) -> None:
    root = tmp_path / "lroot"
    code, out, events = run("lightning_job.py", tmp_path, *FAST, "--root", str(root),
                            "--steps", "12", "--stop-at", "5", extra=ONE_TASK)
    assert code == EXIT_REQUEUE_PREEMPTION, out[-3000:]
    # Lightning's own handler did not end the run first: the step was done, then saved
    assert [e["step"] for e in events if e["event"] == "step"][-1] == 5, events
    assert sorted(x.name for x in root.iterdir()) == ["hpc_ckpt_1.ckpt"]
    record = p.read_record(tmp_path / "state" / "exit")
    assert (record["cause"], record["step"], record["requeue"]) == ("preemption", "6", "1")
    # the next run: trainer.fit(model) under SLURM loads the HPC checkpoint by itself
    code, out, events = run("lightning_job.py", tmp_path, *FAST, "--root", str(root),
                            "--steps", "12", extra={**ONE_TASK, "SLURM_RESTART_COUNT": "1"})
    assert code == 0, out[-3000:]
    starts = [e for e in events if e["event"] == "start"]
    assert [(s["restart"], s["step"]) for s in starts] == [(0, 0), (1, 6)], starts
    assert events[-1]["event"] == "done" and events[-1]["step"] == 12
    # the callback said a step's work, in each run, for report's throughput and MFU
    assert said_work(tmp_path) == [Work(8.0, "samples", 6 * 577.0)] * 2
    assert [s["accumulation"] for s in starts] == [1, 1]


@pytest.mark.lightning
def test_lightning_keeps_the_global_batch_after_a_shrink(tmp_path: Path) -> None:
    """A step the supervisor shrank to half the replicas ([elastic] min_nodes): the
    callback doubles accumulate_grad_batches."""
    code, out, events = run("lightning_job.py", tmp_path, *FAST, "--root",
                            str(tmp_path / "lroot"), "--steps", "3",
                            extra={**ONE_TASK, p.FULL_DP: "2"})
    assert code == 0, out[-3000:]
    assert [e["accumulation"] for e in events if e["event"] == "start"] == [2], events


@pytest.mark.transformers
def test_the_hf_trainer_keeps_the_global_batch_after_a_shrink(tmp_path: Path) -> None:
    code, out, events = run("hf_trainer_job.py", tmp_path, *FAST, "--out",
                            str(tmp_path / "out"), "--steps", "3", extra={p.FULL_DP: "2"})
    assert code == 0, out[-3000:]
    assert [e["accumulation"] for e in events if e["event"] == "start"] == [2], events
    assert said_work(tmp_path) == [Work(8.0, "samples")]      # 4 a batch x 2 x 1 process


def said_work(tmp_path: Path) -> list[Work | None]:
    """The work each run said (rank 0's history, as hpctrain report reads it)."""
    return [Work.parse(e) for e in p.read_history(tmp_path / "state")
            if e.get("event") == "work"]


@pytest.mark.transformers
def test_the_hf_trainer_saves_its_own_checkpoint_on_a_stop_and_resumes_there(
        tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    code, out, events = run("hf_trainer_job.py", tmp_path, *FAST, "--out", str(out_dir),
                            "--steps", "12", "--stop-at", "5")
    assert code == EXIT_REQUEUE_PREEMPTION, out[-3000:]
    # the signal came before step 6 began: step 6 was done, then saved, no evaluation
    assert [e["step"] for e in events if e["event"] == "step"][-1] == 6, events
    assert sorted(x.name for x in out_dir.iterdir()) == ["checkpoint-6"]
    record = p.read_record(tmp_path / "state" / "exit")
    assert (record["cause"], record["step"]) == ("preemption", "6")
    code, out, events = run("hf_trainer_job.py", tmp_path, *FAST, "--out", str(out_dir),
                            "--steps", "12", extra={"SLURM_RESTART_COUNT": "1"})
    assert code == 0, out[-3000:]
    starts = [e for e in events if e["event"] == "start"]
    assert [(s["restart"], s["step"]) for s in starts] == [(0, 0), (1, 6)], starts
    assert events[-1]["event"] == "done" and events[-1]["step"] == 12
    # without arguments, the samples the Trainer's arguments make a step: 4 x 1 x 1
    assert said_work(tmp_path) == [Work(4.0, "samples")] * 2


@pytest.mark.transformers
def test_an_accelerate_loop_attaches_the_runtime_to_accelerates_group(tmp_path: Path) -> None:
    """No callback: the loop calls hpctrain.runtime.attach() after Accelerator(), asks
    ctx.stop_requested() at each step's end and saves with accelerator.save_state."""
    state = tmp_path / "accel"
    code, out, events = run("accelerate_loop.py", tmp_path, "--state", str(state),
                            "--stop-at", "4")
    assert code == EXIT_REQUEUE_PREEMPTION, out[-3000:]
    assert [e["step"] for e in events if e["event"] == "step"][-1] == 5, events
    code, out, events = run("accelerate_loop.py", tmp_path, "--state", str(state),
                            extra={"SLURM_RESTART_COUNT": "1"})
    assert code == 0, out[-3000:]
    starts = [e for e in events if e["event"] == "start"]
    assert [(s["restart"], s["step"]) for s in starts] == [(0, 0), (1, 5)], starts
    assert events[-1] == {**events[-1], "event": "done", "step": 12}
