"""The runtime owns its exit (issue 31), without a scheduler: however a script leaves, its
checkpoint saves are durable before the process group goes, the rank's progress record
says how its work ended, and the process exits with the code the script meant, never an
abort from torch's teardown at interpreter exit.

The abort this guards against comes in about 1 exit of 4 (torch 2.13, gloo: 6 of 16 runs
of a 2-rank runtime script before the teardown, 0 of 24 after), so the script without
``close()`` runs 12 times here: a 1-in-4 failure gets through 12 runs 3% of the time.
The same paths on the devcluster, with Slurm's and ``hpctrain status``'s word on each:
tests/cluster/test_exit_cluster.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import protocol as p
from hpctrain.runtime import EXIT_REQUEUE_TIME_LIMIT
from helpers.torchrun import env_for, start_ranks, wait_ranks

pytestmark = [pytest.mark.torch, pytest.mark.slow]
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
REPEATS = 12


def run_ranks(script: Path, world: int, env: dict[str, str], out: Path,
              args: tuple[str, ...] = ()) -> list[int]:
    """Every rank as its own process (what srun starts), the exit codes by rank."""
    return wait_ranks(start_ranks(script, world, env, out, args))


def last_words(state: Path, world: int) -> list[tuple[str, str, str]]:
    """(exit, phase, flushed) of every rank's progress record."""
    records = [p.read_record(p.rank_file(state, p.PROGRESS, r)) for r in range(world)]
    return [(r.get("exit", ""), r.get("phase", ""), r.get("flushed", "")) for r in records]


def test_the_docs_recipe_without_close_leaves_cleanly_every_time(tmp_path: Path) -> None:
    """docs/fault-recovery.md's ten lines never call close(): 12 runs of 2 ranks, all exit
    0 with nothing aborted, each with its last checkpoint and the ranks' last word."""
    failures = []
    for trial in range(REPEATS):
        root = tmp_path / f"t{trial}"
        (root / "ckpt").mkdir(parents=True)
        # the job spec's [checkpoint] as the rendered script exports it: dir, every 3 steps
        env = env_for(HPCTRAIN_CKPT_DIR=str(root / "ckpt"), HPCTRAIN_CKPT_INTERVAL_STEPS="3",
                      HPCTRAIN_STATE_DIR=str(root / "s"),
                      EVENTS=str(root / "events.jsonl"), STEPS="3")
        out = root / "out.txt"
        try:
            codes = run_ranks(PROGRAMS / "ten_lines.py", 2, env, out)
        except subprocess.TimeoutExpired:     # (the ranks are killed): say what they said
            failures.append(f"trial {trial}: still running after 120 s\n"
                            f"{out.read_text(errors='replace')[-2000:]}")
            continue
        text = out.read_text(errors="replace")
        if codes != [0, 0] or "terminate called" in text:
            failures.append(f"trial {trial}: exit codes {codes}\n{text[-2000:]}")
            continue
        assert (root / "ckpt" / "latest").read_text().strip().endswith("3")
        assert last_words(root / "s", 2) == [("return", "exited", "1")] * 2
    assert not failures, f"{len(failures)} of {REPEATS} runs did not leave cleanly:\n" + \
        "\n".join(failures)


@pytest.mark.parametrize("mode, code, word", [
    ("return", 0, "return"), ("sys_exit", 0, "return"), ("close", 0, "return"),
    ("raise", 1, "crash"), ("requeue", EXIT_REQUEUE_TIME_LIMIT, "requeue")])
def test_every_way_out_makes_the_save_durable_first(tmp_path: Path, mode: str, code: int,
                                                     word: str) -> None:
    (tmp_path / "ckpt").mkdir()
    env = env_for(HPCTRAIN_STATE_DIR=str(tmp_path / "s"),
                  HPCTRAIN_EXIT_FILE=str(tmp_path / "s" / "exit"))
    out = tmp_path / "out.txt"
    assert run_ranks(PROGRAMS / "leave_once.py", 1, env, out,
                     (mode, str(tmp_path / "ckpt"))) == [code], out.read_text()[-3000:]
    assert last_words(tmp_path / "s", 1) == [(word, "exited", "1")]
    assert "terminate called" not in out.read_text(errors="replace")
    # the save in flight as the script left is committed and whole
    res = subprocess.run([sys.executable, "-m", "hpctrain", "ckpt", "verify",
                          str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "step 3: ok" in res.stdout, res.stdout + res.stderr
    if mode == "raise":
        assert p.read_record(tmp_path / "s" / "exit")["error"] == \
            "RuntimeError: boom after the save"


def test_a_function_jobs_callable_leaves_nothing_for_the_interpreters_exit(
        tmp_path: Path) -> None:
    """submit_function's per-rank wrapper tears down what the callable set up (a process
    group of its own, or the runtime's) before submitit pickles the result."""
    script = tmp_path / "call.py"
    script.write_text(
        "import torch.distributed as dist, hpctrain.runtime\n"
        "from hpctrain.runtime.function import RankCall\n"
        "def own(): dist.init_process_group('gloo'); return dist.get_world_size()\n"
        "def runtime(): return hpctrain.runtime.init().world_size\n"
        "for fn in (own, runtime):\n"
        "    assert RankCall(fn, {})() == 1 and not dist.is_initialized(), fn\n"
        "print('both torn down')\n")
    env = env_for(HPCTRAIN_STATE_DIR=str(tmp_path / "s"))
    out = tmp_path / "out.txt"
    assert run_ranks(script, 1, env, out) == [0], out.read_text()[-3000:]
    assert "both torn down" in out.read_text()
    assert last_words(tmp_path / "s", 1) == [("return", "exited", "1")]
