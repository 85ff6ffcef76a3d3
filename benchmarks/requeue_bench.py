"""How much a requeue costs a runtime-using job: requeued start -> first resumed step,
against the same job's cold start (no checkpoint) -> first step, measured in one run.

    SLURM_CONF=/var/lib/hpctrain/devcluster/etc/slurm.conf .venv/bin/python benchmarks/requeue_bench.py

The job is examples/train_gpt.py with DP=4 on 2 nodes x 2 fake GPUs (srun), submitted with
`hpctrain submit`, so both sides include Slurm's launch, the job supervisor and four ranks
importing torch. Each requeue is the time-limit warning as Slurm delivers it
(``scancel --signal=USR2 --batch``): the ranks save the emergency checkpoint, the
supervisor requeues, Slurm starts the job again ~cred_expire s later. The requeued side
adds what a resume costs: the supervisor reading the state directory and the ledger,
asking Slurm, and the ranks loading the checkpoint.

"start" is Slurm's start time of the run (sacct, whole seconds), "first step" the time the
training log records for the run's first finished step. Two cold jobs and ``--requeues``
requeues of the first one; prints medians and the difference (goal: within 2 s).
Needs the devcluster (``hpctrain devcluster up``) and an idle queue.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path("/var/lib/hpctrain/devcluster/shared")


def slurm(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def spec(root: Path, name: str) -> str:
    cmd = [sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--steps", "100000",
           "--save-every", "100000", "--seed", "1", "--step-sleep", "0.25",
           "--ckpt-dir", str(root / "ckpt"), "--log-file", str(root / "log.jsonl")]
    return "\n".join([
        f'name = "{name}"', 'partition = "debug"', "nodes = 2", "gpus_per_node = 2",
        'time = "00:30:00"', f'output = "{root}/job-%j.out"', f'workdir = "{root}"',
        "[layout]", "dp = 4", "[run]", 'launcher = "srun"', f"command = {json.dumps(cmd)}",
        'env = { OMP_NUM_THREADS = "1" }', "[requeue]", "max_requeues = 20",
        'signal = "USR2"', "signal_lead_s = 60", ""])


def submit(root: Path, name: str) -> str:
    root.mkdir(parents=True)
    (root / "job.toml").write_text(spec(root, name))
    # submitted from its own directory: a job without a checkpoint dir keeps its state
    # (.hpctrain/jobs/<id>) in the submit dir
    out = subprocess.run([sys.executable, "-m", "hpctrain", "submit", str(root / "job.toml"),
                          "--json"], capture_output=True, text=True, check=True, timeout=120,
                         cwd=root)
    return json.loads(out.stdout)["job_id"]


def wait(predicate, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")


def run_starts(job: str) -> list[float]:
    out = slurm("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "Start")
    return [datetime.fromisoformat(s).timestamp() for s in map(str.strip, out.splitlines())
            if s and s != "Unknown"]


def step_times(root: Path) -> list[float]:
    path = root / "log.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["time"] for r in records if "loss" in r]


def first_step_after(root: Path, t: float) -> float | None:
    return next((s for s in step_times(root) if s > t), None)


def to_first_step(root: Path, job: str, run: int) -> float:
    """Seconds from run number ``run``'s start to its first finished step (waits for it)."""
    wait(lambda: len(run_starts(job)) > run, 300, f"run {run} of job {job} to start")
    start = run_starts(job)[run]
    wait(lambda: first_step_after(root, start) is not None, 300, f"run {run}'s first step")
    return first_step_after(root, start) - start


def cancel(job: str) -> None:
    subprocess.run(["scancel", job], check=False, timeout=60)
    wait(lambda: not slurm("squeue", "-h", "-j", job, "-o", "%i").strip(), 120,
         f"job {job} to leave the queue")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requeues", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    wait(lambda: not slurm("squeue", "-h", "-o", "%i").strip(), 300, "an idle queue")
    base = Path(tempfile.mkdtemp(prefix="requeue-bench-", dir=SHARED))
    cold, warm = [], []
    job = submit(base / "a", "rq-bench-a")
    try:
        cold.append(to_first_step(base / "a", job, 0))
        for run in range(1, args.requeues + 1):
            time.sleep(2)  # a few steps into the run
            slurm("scancel", "--signal=USR2", "--batch", job)
            warm.append(to_first_step(base / "a", job, run))
    finally:
        cancel(job)
    job = submit(base / "b", "rq-bench-b")
    try:
        cold.append(to_first_step(base / "b", job, 0))
    finally:
        cancel(job)
    result = {"cold_s": cold, "requeued_s": warm, "cold_median_s": statistics.median(cold),
              "requeued_median_s": statistics.median(warm),
              "difference_s": statistics.median(warm) - statistics.median(cold),
              "ratio": statistics.median(warm) / statistics.median(cold)}
    if args.json:
        print(json.dumps(result))
        return
    print("DP=4 examples/train_gpt.py on 2 nodes x 2 fake GPUs (srun), Slurm start -> first step")
    print(f"  cold start (no checkpoint): {', '.join(f'{x:.1f}' for x in cold)} s "
          f"(median {result['cold_median_s']:.1f})")
    print(f"  requeued start (resume):    {', '.join(f'{x:.1f}' for x in warm)} s "
          f"(median {result['requeued_median_s']:.1f})")
    print(f"  requeued - cold: {result['difference_s']:+.1f} s "
          f"(ratio {result['ratio']:.2f}; goal: within 2 s)")


if __name__ == "__main__":
    main()
