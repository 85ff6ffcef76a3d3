"""Stop signals end to end without a scheduler: the handler only sets a flag, one rank's
signal stops every rank at the same step, the exit record and code tell the batch
script to requeue, and the next run learns why the last one ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.runtime import EXIT_REQUEUE_PREEMPTION, EXIT_REQUEUE_TIME_LIMIT
from hpctrain.runtime.exitrecord import read_record
from hpctrain.runtime.signals import StopFlag, parse_signals
from helpers.ckpt import whole_manifest
from helpers.torchrun import env_for, start, worker_pids

JOB = Path(__file__).resolve().parents[1] / "programs" / "runtime_job.py"


def test_handler_only_sets_a_flag_and_restores() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    flag = StopFlag().install([signal.SIGUSR2, signal.SIGTERM])
    try:
        assert not flag
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)  # would end the test run if not caught
        time.sleep(0.01)
        assert flag and flag.signum == signal.SIGUSR2 and flag.count == 2
        assert flag.received_at is not None
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGUSR2) == before


def test_parse_signals() -> None:
    assert parse_signals("USR2,TERM") == (signal.SIGUSR2, signal.SIGTERM)
    assert parse_signals("sigusr2 15") == (signal.SIGUSR2, signal.SIGTERM)
    with pytest.raises(ValueError, match="unknown signal 'USR9'"):
        parse_signals("USR2,USR9")


def lines(out: Path, event: str) -> list[dict]:
    """Every JSON event record the ranks printed. Ranks print concurrently and print()
    writes the text and its newline separately, so records can share a line: decode each
    one where it starts instead of line by line."""
    text, decoder, found = out.read_text(errors="replace"), json.JSONDecoder(), []
    at = text.find('{"event"')
    while at >= 0:
        try:
            rec, _ = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            rec = None  # a record cut by another rank's write: not one of ours to count
        if rec is not None and rec.get("event") == event:
            found.append(rec)
        at = text.find('{"event"', at + 1)
    return sorted(found, key=lambda r: r["rank"])


@pytest.mark.torch
def test_single_process_exits_with_the_requeue_code(tmp_path: Path) -> None:
    """Launched by srun without torchrun the exit code itself carries the protocol: it is
    the cause's code, and an async save still in flight is durable before the exit."""
    import torch

    from hpctrain.checkpoint import CheckpointManager

    env = env_for(SLURM_JOB_ID="77", SLURM_PROCID="0", SLURM_NTASKS="1",
                  SLURM_JOB_NODELIST="localhost", HPCTRAIN_EXIT_FILE=str(tmp_path / "exit"))
    (tmp_path / "ckpt").mkdir()
    proc = subprocess.Popen([sys.executable, str(JOB), "600", "0.05", str(tmp_path / "ckpt")],
                            env=env, stdout=subprocess.PIPE, text=True)
    assert '"event": "start"' in proc.stdout.readline()
    proc.send_signal(signal.SIGUSR2)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_REQUEUE_TIME_LIMIT
    stop = json.loads(out.splitlines()[-1])
    assert stop["cause"] == "time_limit"
    assert read_record(tmp_path / "exit")["job_id"] == "77"
    state = {"w": torch.zeros(10_000_000)}
    with CheckpointManager(tmp_path / "ckpt") as mgr:
        assert mgr.load_latest(state) == stop["step"]
    assert torch.equal(state["w"], torch.full_like(state["w"], float(stop["step"])))


@pytest.mark.torch
@pytest.mark.slow
def test_term_to_one_rank_stops_all_ranks_at_one_step(tmp_path: Path) -> None:
    exit_file = tmp_path / "exit"
    env = env_for(tp=2, pp=2, HPCTRAIN_EXIT_FILE=str(exit_file), SLURM_JOB_ID="900",
                  SLURM_ARRAY_JOB_ID="899", SLURM_ARRAY_TASK_ID="1")
    out, ckpt = tmp_path / "run1.out", tmp_path / "ckpt"
    ckpt.mkdir()
    proc = start(JOB, 4, ["2000", "0.02", str(ckpt)], env, out)
    try:
        deadline = time.monotonic() + 120
        while len(lines(out, "start")) < 4 and time.monotonic() < deadline:
            assert proc.poll() is None, out.read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(0.5)
        os.kill(worker_pids(proc)[2], signal.SIGTERM)  # preemption, seen by one rank
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    starts, stops = lines(out, "start"), lines(out, "stop")
    # the mesh puts tp fastest, then dp, then pp (Megatron's order)
    assert [s["coords"] for s in starts] == [[0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 0, 1]]
    assert all(s["mesh"] == s["coords"] and s["group_sizes"] == [2, 1, 2] for s in starts)
    assert all(s["job_id"] == "899_1" and s["last"] is None for s in starts)
    assert [s["rank"] for s in stops] == [0, 1, 2, 3]
    assert len({s["step"] for s in stops}) == 1 and stops[0]["cause"] == "preemption"
    # the 4 ranks' async emergency save was durable before exit_for_requeue tore down
    # the process group: "w" written once, each rank's own "mine" kept for it
    import torch

    from hpctrain.checkpoint import CheckpointManager

    manifest = whole_manifest(ckpt / f"step_{stops[0]['step']:09d}")
    assert [t.get("rank") for t in manifest["tensors"] if t["path"] == ["w"]] == [None]
    assert sorted(t["rank"] for t in manifest["tensors"] if t["path"] == ["mine"]) == [0, 1, 2, 3]
    state = {"w": torch.zeros(10_000_000), "mine": torch.ones(1000)}
    with CheckpointManager(ckpt) as mgr:
        assert mgr.load_latest(state) == stops[0]["step"]
    assert torch.equal(state["w"], torch.full_like(state["w"], float(stops[0]["step"])))
    assert torch.equal(state["mine"], torch.zeros(1000))  # rank 0's own
    record = read_record(exit_file)
    assert record["cause"] == "preemption"
    assert record["exit_code"] == str(EXIT_REQUEUE_PREEMPTION)
    assert record["step"] == str(stops[0]["step"]) and record["job_id"] == "899_1"

    # requeued: the next run knows why the last one ended ...
    out2 = tmp_path / "run2.out"
    proc = start(JOB, 4, ["0", "0"], {**env, "SLURM_RESTART_COUNT": "1"}, out2)
    assert proc.wait(timeout=120) == 0, out2.read_text()[-3000:]
    assert {s["last"] for s in lines(out2, "start")} == {"preemption"}
    # ... and a requeue with no record from the run before it was a node failure
    out3 = tmp_path / "run3.out"
    proc = start(JOB, 4, ["0", "0"], {**env, "SLURM_RESTART_COUNT": "2"}, out3)
    assert proc.wait(timeout=120) == 0, out3.read_text()[-3000:]
    assert {s["last"] for s in lines(out3, "start")} == {"node_fail"}
