#!/usr/bin/env python3
"""Make docs/report-example.html and its pictures from a real devcluster job.

    python tools/report_example.py             # run the job, then write the page
    python tools/report_example.py --job ID    # write the page of a job run before
    python tools/report_example.py --out DIR   # the page elsewhere (docs/ is the default)

The job is the README's demo (examples/train_gpt.py, examples/gpt.toml: 2 nodes x 2 fake
GPUs, tp=2 x dp=2, a step's work said with ctx.set_work) with a rank hung in step 60 of
its first attempt (found by the watchdog, restarted in place from the checkpoint of step
50) and a preemption by an `urgent` job after step 120 (an emergency save, a requeue, the
rest in a second run). The page is ``hpctrain report JOB --html``; its SVGs go beside it
as docs/report-example-{timeline,steps,throughput}.svg for docs/report.md. Needs the
devcluster (HPCTRAIN_DEVCLUSTER_INSTANCE picks the instance) and an idle queue.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SHARED = Path("/var/lib/hpctrain/devcluster/shared")
STEPS, HANG_STEP, PREEMPT_AFTER = 200, 60, 120


def hpctrain(*argv: str, cwd: Path | None = None) -> str:
    return subprocess.run([sys.executable, "-m", "hpctrain", *argv], cwd=cwd, check=True,
                          capture_output=True, text=True, timeout=120).stdout


def steps_done(log: Path) -> int:
    if not log.exists():
        return 0
    return sum('"loss"' in line for line in log.read_text().splitlines())


def run_job() -> tuple[str, Path]:
    """Submit the demo with a hang and preempt it; (its job id, its run directory)."""
    run = SHARED / f"report-example-{uuid.uuid4().hex[:8]}"
    run.mkdir(parents=True)
    log = run / "steps.jsonl"
    command = [sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--steps", str(STEPS),
               "--log-file", str(log), "--step-sleep", "0.05", "--fault", f"hang@{HANG_STEP}:3"]
    out = hpctrain("submit", str(ROOT / "examples" / "gpt.toml"), "--json",
                   "--set", f"workdir={run}", "--set", f"checkpoint.dir={run}/ckpt",
                   "--set", "checkpoint.interval_steps=25", "--set", "watchdog.hang_timeout_s=10",
                   "--set", f"run.command={json.dumps(command)}", cwd=run)
    job = json.loads(out)["job_id"]
    while steps_done(log) < PREEMPT_AFTER:
        time.sleep(1)
    nodes = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True,
                           text=True, check=True).stdout.strip()
    first = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True,
                           text=True, check=True).stdout.split()[0]
    subprocess.run(["sbatch", "-p", "urgent", f"--nodelist={first}", "--gres=gpu:2",
                    "-o", "/dev/null", "--wrap", "sleep 1"], check=True, capture_output=True)
    while json.loads(hpctrain("status", job, "--json"))["jobs"][0]["state"] not in (
            "COMPLETED", "FAILED", "CANCELLED"):
        time.sleep(2)
    return job, run


def write_page(job: str, base: str | None, out: Path) -> None:
    page = out / "report-example.html"
    args = ["report", job, "--html", str(page)] + (["--dir", base] if base else [])
    print(hpctrain(*args))
    html = page.read_text()
    for name in ("timeline", "steps", "throughput"):
        found = re.search(rf'<svg id="{name}".*?</svg>', html, re.S)
        if found:
            (out / f"report-example-{name}.svg").write_text(
                '<?xml version="1.0" encoding="utf-8"?>\n' + found.group(0) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", help="a job run before (its report only)")
    ap.add_argument("--dir", help="that job's checkpoint dir, when hpctrain did not submit it")
    ap.add_argument("--out", type=Path, default=DOCS, help="where the page goes [docs/]")
    args = ap.parse_args()
    from hpctrain.devcluster.cluster import DevCluster

    os.environ.update(DevCluster().client_env())
    if args.job:
        write_page(args.job, args.dir, args.out)
    else:
        job, run = run_job()
        print(f"job {job} ran in {run}")
        write_page(job, None, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
