"""The CLI and the cluster as the devcluster tests drive them: submit a spec file with
`hpctrain submit`, read `hpctrain status --json`, a job's log and its events file, and
preempt a job with an `urgent` one."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpctrain.slurm import client
from helpers import admin
from helpers.jsonl import read_jsonl
from helpers.slurm import sbatch, wait_done


def submit(root: Path, text: str, *args: str) -> str:
    (root / "job.toml").write_text(text)
    res = subprocess.run([sys.executable, "-m", "hpctrain", "submit", str(root / "job.toml"),
                          "--json", *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["job_id"]


def events(root: Path, name: str | None = None) -> list[dict[str, Any]]:
    found = read_jsonl(root / "events.jsonl")
    return [e for e in found if name is None or e["event"] == name]


def job_log(root: Path, job: str) -> str:
    path = root / f"job-{job}.out"
    return path.read_text(errors="replace") if path.exists() else "(no log)"


def status(job: str) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "hpctrain", "status", job, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["jobs"][0]


def preempt(job: str) -> None:
    """An urgent job on the node the debug job runs on: Slurm preempts it (GraceTime 10 s)."""
    node = client.run(["squeue", "-h", "-j", job, "-o", "%N"]).stdout.strip()
    assert node, f"job {job} is not running"
    urgent = sbatch("-p", "urgent", f"--nodelist={node}", "--gres=gpu:2", "-o", "/dev/null",
                    "--wrap", "sleep 1")
    assert wait_done(urgent, 120) == "COMPLETED"


@contextmanager
def send_user_signal(conf: Path, grace_s: int | None = None) -> Iterator[None]:
    """The site setting ``SlurmctldParameters=preempt_send_user_signal`` while the block
    runs (Slurm 22.05 reads it there): on a preemption GraceTime starts with the job's
    --signal to the batch step, and the steps get no SIGTERM of Slurm's. ``grace_s``: the
    partitions' GraceTime meanwhile (a site that gives a framework's own save its time)."""
    original = conf.read_text()
    text = original if grace_s is None else original.replace("GraceTime=10 ",
                                                             f"GraceTime={grace_s} ")
    # (the devcluster's slurm.conf says GraceTime=10 on every preemptible partition: if it
    # ever says it otherwise, fail here rather than run the test on the old grace time)
    assert grace_s is None or text != original, f"no 'GraceTime=10 ' in {conf}"
    try:
        admin.run(["tee", str(conf)],
                  input=text + "SlurmctldParameters=preempt_send_user_signal\n")
        admin.run(["scontrol", "reconfigure"])
        yield
    finally:
        admin.run(["tee", str(conf)], input=original)
        admin.run(["scontrol", "reconfigure"])
