"""examples/train_deepspeed.py (ZeRO-2, CPU accelerator, gloo) trains, saves through the
checkpoint manager, stops on a signal to one rank and resumes bitwise equal to an
uninterrupted run, with every step logged exactly once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hpctrain.runtime import EXIT_REQUEUE_PREEMPTION
from hpctrain.runtime.exitrecord import read_record
from torchrun_util import (
    EXAMPLES,
    bitwise_equal,
    env_for,
    events,
    final_state,
    run,
    signal_rank_at,
    start,
    steps,
    stopped_ranks,
)

SCRIPT = EXAMPLES / "train_deepspeed.py"


def args_for(d: Path, name: str, total: int) -> list[str]:
    return ["--steps", str(total), "--save-every", "10", "--seed", "5",
            "--ckpt-dir", str(d / f"{name}-ckpt"), "--log-file", str(d / f"{name}.jsonl"),
            "--final-state", str(d / name)]


@pytest.mark.deepspeed
@pytest.mark.torch
@pytest.mark.slow
def test_zero2_preempted_and_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    total, env = 30, env_for(DS_ACCELERATOR="cpu")
    assert run(SCRIPT, 2, args_for(tmp_path, "ref", total), env, tmp_path / "ref.out") == 0, \
        (tmp_path / "ref.out").read_text()[-3000:]
    assert sorted(p.name for p in (tmp_path / "ref-ckpt").iterdir() if p.is_dir()) == \
        ["step_000000010", "step_000000020", "step_000000030"]

    exit_file = tmp_path / "exit"
    env = {**env, "HPCTRAIN_EXIT_FILE": str(exit_file)}
    out1 = tmp_path / "run1.out"
    proc = start(SCRIPT, 2, [*args_for(tmp_path, "run", total), "--step-sleep", "0.1"], env, out1)
    try:
        signal_rank_at(proc, tmp_path / "run.jsonl", 12, 1, signal.SIGTERM)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    record = read_record(exit_file)
    stop = int(record["step"])
    assert record["exit_code"] == str(EXIT_REQUEUE_PREEMPTION)
    assert stopped_ranks(out1) == {0: stop, 1: stop}
    assert (tmp_path / "run-ckpt" / f"step_{stop:09d}").is_dir()  # the emergency save

    out2 = tmp_path / "run2.out"
    rc = run(SCRIPT, 2, args_for(tmp_path, "run", total), {**env, "SLURM_RESTART_COUNT": "1"},
             out2)
    assert rc == 0, out2.read_text()[-3000:]
    log = tmp_path / "run.jsonl"
    assert [e["step"] for e in events(log, "start")] == [0, stop]
    assert events(log, "start")[1]["last_exit_cause"] == "preemption"
    assert steps(log) == list(range(total))
    assert bitwise_equal(final_state(tmp_path / "ref", 2), final_state(tmp_path / "run", 2))
