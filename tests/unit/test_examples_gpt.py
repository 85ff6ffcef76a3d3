"""examples/train_gpt.py under torchrun (no scheduler): a 3D run whose ranks are stopped
by a signal to ONE of them, save, exit for requeue, and resume to the very same final
parameters as an uninterrupted run, with every step in the log exactly once. (DP, TP, PP
and ZeRO-2 survive Slurm's preemption, time limit and node loss in
tests/cluster/test_recovery_cluster.py.)

Tolerance: bitwise. The batch of each step is a pure function of (seed, step, dp rank),
there is no dropout, and gloo's collectives and the CPU kernels are deterministic for a
fixed layout, so a resumed run performs the identical floating-point operations.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hpctrain.runtime import EXIT_REQUEUE_TIME_LIMIT
from hpctrain.runtime.exitrecord import read_record
from helpers import warm
from helpers.torchrun import (
    EXAMPLES,
    bitwise_equal,
    env_for,
    events,
    final_state,
    max_abs_diff,
    records,
    run,
    signal_rank_at,
    start,
    steps,
    stopped_ranks,
)

SCRIPT = EXAMPLES / "train_gpt.py"


def train_args(d: Path, name: str, steps_: int, save_every: int) -> list[str]:
    return ["--steps", str(steps_), "--save-every", str(save_every), "--seed", "7",
            "--ckpt-dir", str(d / f"{name}-ckpt"), "--log-file", str(d / f"{name}.jsonl"),
            "--final-state", str(d / name)]


def interrupted_then_resumed(tmp_path: Path, tp: int, pp: int, nproc: int, total: int,
                             signal_at: int, sig: int, rank: int) -> dict:
    """Reference run (forked ranks: helpers.warm), a run stopped by ``sig`` to ``rank``
    after step ``signal_at``, then the requeued run (SLURM_RESTART_COUNT=1), both under
    torchrun; returns what the tests check."""
    ref_rc = warm.run(SCRIPT, nproc, train_args(tmp_path, "ref", total, 10),
                      env_for(tp, pp), tmp_path / "ref.out")
    assert ref_rc == 0, (tmp_path / "ref.out").read_text()[-3000:]

    exit_file = tmp_path / "exit-record"
    args = train_args(tmp_path, "run", total, 10)
    out1 = tmp_path / "run1.out"
    # --step-sleep: room for the signal to land mid-run instead of after the last step
    proc = start(SCRIPT, nproc, [*args, "--step-sleep", "0.1"],
                 env_for(tp, pp, HPCTRAIN_EXIT_FILE=str(exit_file)), out1)
    try:
        signal_rank_at(proc, tmp_path / "run.jsonl", signal_at, rank, sig)
        first_rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    record = read_record(exit_file)
    resumed_rc = run(SCRIPT, nproc, args,
                     env_for(tp, pp, HPCTRAIN_EXIT_FILE=str(exit_file), SLURM_RESTART_COUNT="1"),
                     tmp_path / "run2.out")
    assert resumed_rc == 0, (tmp_path / "run2.out").read_text()[-3000:]
    return {"first_rc": first_rc, "record": record, "stopped": stopped_ranks(out1),
            "log": tmp_path / "run.jsonl",
            "ref": final_state(tmp_path / "ref", nproc),
            "run": final_state(tmp_path / "run", nproc)}


def check_resume(r: dict, nproc: int, total: int, cause: str, code: int) -> None:
    stop_step = int(r["record"]["step"])
    # every rank stopped after the same step, the one saved on the signal
    assert r["stopped"] == {rank: stop_step for rank in range(nproc)}
    assert r["record"]["cause"] == cause and r["record"]["exit_code"] == str(code)
    assert r["first_rc"] != 0  # torchrun reports 1 for a worker's 75/76: hence the record
    starts = events(r["log"], "start")
    assert [s["step"] for s in starts] == [0, stop_step]
    assert starts[1]["last_exit_cause"] == cause
    # the requeued run starts exactly where the signal stopped it: no step twice or skipped
    assert steps(r["log"]) == list(range(total))
    assert 0 < stop_step < total
    assert max_abs_diff(r["ref"], r["run"]) == 0.0
    assert bitwise_equal(r["ref"], r["run"])


@pytest.mark.torch
@pytest.mark.slow
def test_3d_tp2_dp2_pp2_resume_is_bitwise(tmp_path: Path) -> None:
    """One rank of eight gets the time-limit signal; every rank stops at the same step (the
    agreement), and the requeued run ends bitwise where an uninterrupted one does. (TERM
    to one rank is tests/unit/test_runtime_signals.py; each layout's resume after Slurm's own
    signals is tests/cluster/test_recovery_cluster.py.)"""
    total = 16
    r = interrupted_then_resumed(tmp_path, 2, 2, 8, total, signal_at=5, sig=signal.SIGUSR2,
                                 rank=5)
    check_resume(r, 8, total, "time_limit", EXIT_REQUEUE_TIME_LIMIT)


@pytest.mark.torch
def test_user_crash_is_not_a_requeue(tmp_path: Path) -> None:
    exit_file = tmp_path / "exit-record"
    out = tmp_path / "crash.out"
    rc = run(SCRIPT, 2, [*train_args(tmp_path, "crash", 20, 5), "--crash-at-step", "7"],
             env_for(HPCTRAIN_EXIT_FILE=str(exit_file)), out)
    assert rc != 0
    assert "simulated user crash" in out.read_text()
    # the record names the crash and does not tell the batch script to requeue
    record = read_record(exit_file)
    assert record["cause"] == "user_crash" and record["requeue"] == "0", record
    assert record["step"] == "7" and "simulated user crash" in record["error"]
    assert steps(tmp_path / "crash.jsonl") == list(range(7))
    # the periodic checkpoint before the crash is there for a manual restart
    assert (tmp_path / "crash-ckpt" / "step_000000005").is_dir()


@pytest.mark.torch
def test_loss_falls(tmp_path: Path) -> None:
    rc = run(SCRIPT, 2, train_args(tmp_path, "learn", 100, 1000), env_for(),
             tmp_path / "learn.out")
    assert rc == 0, (tmp_path / "learn.out").read_text()[-3000:]
    losses = [r["loss"] for r in records(tmp_path / "learn.jsonl") if "loss" in r]
    assert len(losses) == 100
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:10]) / 10
