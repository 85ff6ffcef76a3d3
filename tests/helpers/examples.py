"""The example training job as the devcluster end-to-end tests submit it.

examples/train_gpt.py on 2 nodes x 2 fake GPUs (tp=2 x dp=2, torchrun), its checkpoints
and step log under ``root`` on the shared storage, submitted with `hpctrain submit`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.specs import spec_toml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_spec(root: Path, *, name: str, total: int, save_every: int, step_sleep: float,
                 time: str = "00:20:00", signal_lead_s: int = 60,
                 extra: tuple[str, ...] = (), script: str = "train_gpt.py",
                 layout: dict[str, int] | None = None, env: dict[str, str] | None = None,
                 requeue: dict[str, int] | None = None, launcher: str = "torchrun",
                 partition: str = "debug", **sections: dict) -> str:
    """The job spec (TOML text) for ``total`` steps of an example script, seed 11, on
    2 nodes x 2 fake GPUs; ``layout`` defaults to tp=2 (x dp=2); ``sections`` adds
    further ones (``elastic={"spare_nodes": 1}``)."""
    cmd = [sys.executable, str(EXAMPLES / script), "--steps", str(total),
           "--save-every", str(save_every), "--seed", "11", "--step-sleep", str(step_sleep),
           "--ckpt-dir", str(root / "ckpt"), "--log-file", str(root / "loss.jsonl"), *extra]
    return spec_toml(
        name=name, partition=partition, nodes=2, gpus_per_node=2, time=time,
        output=f"{root}/job-%j.out", workdir=str(root), layout=layout or {"tp": 2},
        run={"launcher": launcher, "command": cmd,
             "env": {"OMP_NUM_THREADS": "1", **(env or {})}},
        requeue={"max_requeues": 3, **(requeue or {}), "signal": "USR2",
                 "signal_lead_s": signal_lead_s}, **sections)


def submit_example(root: Path, spec: str) -> str:
    """Write ``spec`` to root/spec.toml, submit it with the CLI, return the job id."""
    path = root / "spec.toml"
    path.write_text(spec)
    res = subprocess.run([sys.executable, "-m", "hpctrain", "submit", str(path), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["job_id"]
