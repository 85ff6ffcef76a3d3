"""Run multi-process jobs locally under ``torchrun --standalone`` (no scheduler) and
interrupt them the way Slurm does: a signal to one worker process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from helpers.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def env_for(tp: int = 1, pp: int = 1, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "HPCTRAIN_", "MASTER_", "RANK", "WORLD_SIZE"))}
    env.update(HPCTRAIN_TP=str(tp), HPCTRAIN_PP=str(pp), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", **extra)
    return env


def start(script: Path | str, nproc: int, args: list[str], env: dict[str, str],
          out: Path) -> subprocess.Popen:
    """Start torchrun in the background, output to ``out``."""
    fh = open(out, "ab")  # noqa: SIM115 - closed by the child's exit; Popen keeps a dup
    return subprocess.Popen([*TORCHRUN, f"--nproc_per_node={nproc}", str(script), *args],
                            env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)


def run(script: Path | str, nproc: int, args: list[str], env: dict[str, str], out: Path,
        timeout: float = 240) -> int:
    proc = start(script, nproc, args, env, out)
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def worker_pids(proc: subprocess.Popen) -> dict[int, int]:
    """RANK -> pid of torchrun's worker processes (read from /proc)."""
    found: dict[int, int] = {}
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except FileNotFoundError:
        return found
    for pid in children:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, PermissionError):
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = int(pid)
    return found


def signal_rank_at(proc: subprocess.Popen, log: Path, step: int, rank: int, sig: int,
                   timeout: float = 180) -> None:
    """Once ``log`` shows ``step`` finished, send ``sig`` to the worker with ``rank``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"job ended (rc={proc.returncode}) before step {step}"
        if step in steps(log):
            pid = worker_pids(proc).get(rank)
            if pid is not None:
                os.kill(pid, sig)
                return
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout}s")


def records(log: Path) -> list[dict]:
    return read_jsonl(log)


def steps(log: Path) -> list[int]:
    """Training steps in log order (event lines excluded)."""
    return [r["step"] for r in records(log) if "loss" in r]


def events(log: Path, kind: str) -> list[dict]:
    return [r for r in records(log) if r.get("event") == kind]


def final_state(prefix: Path, nproc: int) -> list[dict[str, torch.Tensor]]:
    return [torch.load(f"{prefix}.rank{r}.pt") for r in range(nproc)]


def max_abs_diff(a: list[dict], b: list[dict]) -> float:
    """Largest element difference between two runs' final parameters (all ranks)."""
    assert [sorted(x) for x in a] == [sorted(y) for y in b], "different parameter sets"
    return max((x[k].double() - y[k].double()).abs().max().item()
               for x, y in zip(a, b) for k in x)


def bitwise_equal(a: list[dict], b: list[dict]) -> bool:
    return all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)


def stopped_ranks(out: Path) -> dict[int, int]:
    """rank -> step, from the 'hpctrain: rank R stopping after step S' lines."""
    # ranks print concurrently: lines may run into each other, so match anywhere
    pattern = re.compile(r"hpctrain: rank (\d+) stopping after step (\d+)")
    return {int(r): int(s) for r, s in pattern.findall(out.read_text(errors="replace"))}


__all__ = ["EXAMPLES", "env_for", "start", "run", "worker_pids", "signal_rank_at", "records",
           "steps", "events", "final_state", "max_abs_diff", "bitwise_equal", "stopped_ranks"]


def start_ranks(script: Path | str, world: int, env: dict[str, str], out: Path,
                args: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    """Every rank as its own process (what srun starts), rendezvous on a free local port,
    output appended to ``out``."""
    from helpers.ckpt import free_port

    port = str(free_port())
    with open(out, "ab") as fh:
        return [subprocess.Popen(
            [sys.executable, str(script), *args], stdout=fh, stderr=subprocess.STDOUT,
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}) for rank in range(world)]


def wait_ranks(procs: list[subprocess.Popen], timeout: float = 120) -> list[int]:
    """The ranks' exit codes; any still running after ``timeout`` is killed."""
    try:
        return [proc.wait(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
