"""The jobs the node-loss tests run on the devcluster (tests/cluster/test_node_loss_*.py):
the plainest DP loop on partition ``wide`` with a spare node, submitted with the CLI, and
what they read of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hpctrain.slurm import client
from helpers.slurm import wait_until
from helpers.specs import spec_toml
from helpers.torchrun import events

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
TOTAL, EVERY = 40, 8


def job_log(root: Path, job: str) -> str:
    """The supervisor's lines of the job's log (the ranks' tracebacks left out: under
    torchrun they fill it)."""
    path = root / f"job-{job}.out"
    text = path.read_text(errors="replace") if path.exists() else "(no job output)"
    return "\n".join(line for line in text.splitlines()
                     if line.startswith(("hpctrain:", "srun:", "(no job")))


def empty_queue() -> None:
    """Killing a node under somebody else's job would break their test."""
    wait_until(lambda: not client.run(["squeue", "-h", "-o", "%i"]).stdout.strip(), 300,
               "an empty queue (other tests' jobs to finish)", interval_s=2)


def loop_spec(root: Path, launcher: str, init: bool = True) -> str:
    """The plainest DP loop on partition ``wide`` with a spare; ``init``: under
    ``runtime.init()`` (restarts in new processes), else under ``runtime.run``."""
    cmd = [sys.executable, str(PROGRAMS / "plain_dp_loop.py"), "--steps", str(TOTAL),
           "--save-every", str(EVERY), "--step-sleep", "0.2", "--ckpt-dir",
           str(root / "ckpt"), "--events", str(root / "events.jsonl"), "--final",
           str(root / "final"), *(["--init"] if init else [])]
    return spec_toml(
        name=f"loss-{launcher}", partition="wide", nodes=2, gpus_per_node=2,
        time="00:10:00", output=f"{root}/job-%j.out", workdir=str(root), layout={"dp": 4},
        run={"launcher": launcher, "command": cmd, "env": {"OMP_NUM_THREADS": "1"}},
        checkpoint={"dir": str(root / "ckpt")}, elastic={"spare_nodes": 1},
        requeue={"max_requeues": 3, "max_crash_restarts": 0})


def submit(root: Path, spec: str) -> str:
    path = root / "spec.toml"
    path.write_text(spec)
    res = subprocess.run([sys.executable, "-m", "hpctrain", "submit", str(path), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["job_id"]


def step_done(root: Path, at_least: int) -> bool:
    return max((e["step"] for e in events(root / "events.jsonl", "step")), default=-1) \
        >= at_least


