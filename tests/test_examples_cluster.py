"""examples/train_gpt.py submitted with `hpctrain submit` to the real devcluster (2 nodes
x 2 fake GPUs, tp=2 x dp=2), preempted by an `urgent` job: Slurm requeues it, it resumes
at the step saved on the signal, finishes, and ends bitwise equal to an uninterrupted
local run with the same seed and layout. Prints the measured figures.

The built-in templates are used as they are: the batch script's requeue decision reads
the training process's exit code / exit record (hpctrain.runtime)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from example_jobs import example_spec, submit_example
from jobs_util import isolate
from slurm_util import sacct_states, sbatch, wait_done, wait_until
from torchrun_util import (
    EXAMPLES,
    bitwise_equal,
    env_for,
    events,
    final_state,
    records,
    run,
    steps,
)
from hpctrain.slurm import client

TOTAL = 60


def spec_text(root: Path, total: int = TOTAL, step_sleep: float = 0.3, time: str = "00:20:00",
              signal_lead_s: int = 60) -> str:
    return example_spec(root, name="rt-preempt", total=total, save_every=20,
                        step_sleep=step_sleep, time=time, signal_lead_s=signal_lead_s,
                        extra=("--final-state", str(root / "final")))


def slurm_start_times(job_id: str) -> list[float]:
    out = client.run(["sacct", "-n", "-X", "-P", "-D", "-j", job_id, "-o", "Start"]).stdout
    return [datetime.fromisoformat(s.strip()).timestamp() for s in out.splitlines() if s.strip()]


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
def test_preempted_tp_dp_job_resumes_without_losing_a_step(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    job = submit_example(root, spec_text(root))
    log = root / "loss.jsonl"
    wait_until(lambda: len(steps(log)) >= 15, 180, "15 training steps on the cluster")

    urgent = sbatch("-p", "urgent", "--nodes=2", "--gres=gpu:2",
                    f"--output={root}/urgent-%j.out", "--wrap", "sleep 3")
    assert wait_done(urgent, 180) == "COMPLETED"
    assert wait_done(job, 300) == "COMPLETED", (root / f"job-{job}.out").read_text()[-3000:]

    assert sacct_states(job) == ["REQUEUED", "COMPLETED"]
    stop = events(log, "stop")
    starts = events(log, "start")
    assert len(stop) == 1 and stop[0]["cause"] == "preemption"
    # resumes at the step saved on the signal (periodic saves are every 20 steps only)
    assert [s["step"] for s in starts] == [0, stop[0]["step"]]
    assert starts[1]["restart"] == 1 and starts[1]["last_exit_cause"] == "preemption"
    assert steps(log) == list(range(TOTAL))  # no step twice, none skipped

    # figures: steps lost per preemption; requeued run start -> first resumed step
    last_before = max(s for s in steps(log) if s < stop[0]["step"])
    lost = (last_before + 1) - stop[0]["step"]
    first_resumed = next(r["time"] for r in records(log) if r.get("step") == stop[0]["step"]
                         and "loss" in r)
    to_first_step = first_resumed - slurm_start_times(job)[-1]
    print(f"\nfigures: completed steps lost per preemption = {lost}; "
          f"seconds from requeued start to first resumed step = {to_first_step:.1f}")
    assert lost == 0

    # bitwise equal to an uninterrupted local run (same seed, same tp=2 x dp=2 layout)
    ref = tmp_path / "ref"
    args = ["--steps", str(TOTAL), "--save-every", "20", "--seed", "11",
            "--ckpt-dir", str(tmp_path / "ref-ckpt"), "--log-file", str(tmp_path / "ref.jsonl"),
            "--final-state", str(ref)]
    rc = run(EXAMPLES / "train_gpt.py", 4, args, env_for(tp=2), tmp_path / "ref.out")
    assert rc == 0, (tmp_path / "ref.out").read_text()[-3000:]
    assert bitwise_equal(final_state(ref, 4), final_state(root / "final", 4))


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
def test_time_limit_signal_checkpoints_requeues_and_resumes(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The time-limit warning, delivered as Slurm delivers it (USR2 to the batch shell;
    `scancel --signal=USR2 --batch`, as the issue allows, instead of waiting minutes for a
    real limit: tests/test_render_slurm.py covers a real one). The script signals the
    torchrun step through Slurm (not by killing srun), the ranks save and leave with the
    time-limit cause (3-minute job: the warning is near its end), the batch script
    requeues, and the job finishes with every step run exactly once."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    total = 100
    job = submit_example(root, spec_text(root, total=total, step_sleep=0.2, time="00:03:00",
                                         signal_lead_s=60))
    log = root / "loss.jsonl"
    try:
        wait_until(lambda: len(steps(log)) >= 20, 180, "20 training steps on the cluster")
        client.run(["scancel", "--signal=USR2", "--batch", job])
        state = wait_done(job, 300)
    finally:
        client.run(["scancel", job], check=False)
    out = (root / f"job-{job}.out").read_text()
    assert state == "COMPLETED", out[-3000:]
    stops, starts = events(log, "stop"), events(log, "start")
    assert [s["cause"] for s in stops] == ["time_limit"], out[-3000:]
    assert len(starts) == 2 and starts[1]["last_exit_cause"] == "time_limit"
    # it resumes at the step its emergency checkpoint saved: nothing lost or redone
    assert starts[1]["step"] == stops[0]["step"]
    assert steps(log) == list(range(total))
    assert sacct_states(job) == ["REQUEUED", "COMPLETED"]
