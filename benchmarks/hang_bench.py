"""What a hang costs with the watchdog: detection latency, and the time from the detected
hang to the first resumed step, restarted inside the allocation vs. requeued, measured in
one run; then the goodput of a 2x2 job through one hang and one preemption.

    SLURM_CONF=/var/lib/hpctrain/devcluster/etc/slurm.conf .venv/bin/python benchmarks/hang_bench.py

The job is tests/programs/allreduce_steps.py on 2 nodes x 2 fake GPUs under torchrun (every
step all-reduces, as DDP does), submitted with `hpctrain submit`, hang_timeout_s=10. In each
job rank 3 stops joining the all-reduce in step 8 of the first attempt.

- in place: max_step_restarts=2 (the default);
- requeue: max_step_restarts=0, so the supervisor requeues after the hang (the devcluster
  holds a requeued job cred_expire+1 = 6 s; a real cluster 121 s plus the queue wait);
- goodput: in place, plus a preemption by an `urgent` job mid-run. Goodput = the steps the
  job kept x the median step time / the GPU-time allocated (sacct's Elapsed of every run).

Detection latency: the ledger's `detected_at` minus the hung step's start (rank 0's last
step event before the hang). Goal: <= hang_timeout + 5 s; in place at least 2x faster than
requeue. Needs the devcluster and an idle queue.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path("/var/lib/hpctrain/devcluster/shared")
HANG_S, HANG_STEP, STEPS, GOODPUT_STEPS = 10, 8, 40, 150


def slurm(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def submit(root: Path, name: str, restarts: int, steps: int = STEPS) -> str:
    root.mkdir(parents=True)
    cmd = [sys.executable, str(ROOT / "tests" / "programs" / "allreduce_steps.py"),
           "--steps", str(steps), "--save-every", "5", "--step-sleep", "0.3",
           "--ckpt-dir", str(root / "ckpt"), "--events", str(root / "events.jsonl"),
           "--hang", f"3:{HANG_STEP}:0"]
    (root / "job.toml").write_text("\n".join([
        f'name = "{name}"', 'partition = "debug"', "nodes = 2", "gpus_per_node = 2",
        'time = "00:20:00"', f'output = "{root}/job-%j.out"', f'workdir = "{root}"',
        "[run]", 'launcher = "torchrun"', f"command = {json.dumps(cmd)}",
        'env = { OMP_NUM_THREADS = "1" }', "[checkpoint]", f'dir = "{root}/ckpt"',
        "[watchdog]", f"hang_timeout_s = {HANG_S}", f"max_step_restarts = {restarts}", ""]))
    out = subprocess.run([sys.executable, "-m", "hpctrain", "submit", str(root / "job.toml"),
                          "--json"], capture_output=True, text=True, check=True, timeout=120,
                         cwd=root)
    return json.loads(out.stdout)["job_id"]


def events(root: Path) -> list[dict]:
    path = root / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def wait_done(job: str, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while slurm("squeue", "-h", "-j", job, "-o", "%T").strip():
        if time.monotonic() > end:
            raise SystemExit(f"job {job} did not finish within {timeout:.0f} s")
        time.sleep(1)


def ledger(root: Path, job: str) -> list[dict[str, str]]:
    text = (root / "ckpt" / ".hpctrain" / "jobs" / job / "ledger").read_text()
    return [{"kind": w[0], **dict(x.split("=", 1) for x in w[1:])}
            for w in (line.split() for line in text.splitlines()) if w]


def hang_figures(root: Path, job: str) -> tuple[float, float]:
    """(detection latency, detected hang -> first step after it) of one job. The hung
    step started when rank 0 logged the step before it."""
    evs = [e for e in events(root) if e["event"] == "step"]
    detected = next(float(e["detected_at"]) for e in ledger(root, job)
                    if e.get("detected_at"))
    before = max(e["time"] for e in evs if e["time"] < detected)
    resumed = min(e["time"] for e in evs if e["time"] > detected)
    return detected - before, resumed - detected


def elapsed_s(job: str) -> float:
    """GPU-seconds allocated over every run of the job: sacct's Elapsed x its GPUs."""
    total = 0.0
    for line in slurm("sacct", "-n", "-X", "-D", "-P", "-j", job, "-o",
                      "ElapsedRaw,AllocTRES").splitlines():
        raw, tres = line.split("|")
        gpus = next((int(t.split("=")[1]) for t in tres.split(",") if t.startswith("gres/gpu=")),
                    1)
        total += int(raw) * gpus
    return total


def preempt(job: str) -> None:
    nodes = slurm("squeue", "-h", "-j", job, "-o", "%N").strip()
    slurm("sbatch", "-p", "urgent", f"--nodelist={nodes}", "-N", "2", "--gres=gpu:2",
          "-o", "/dev/null", "--wrap", "sleep 1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="hang-bench-", dir=SHARED))
    runs = {}
    for name, restarts in (("inplace", 2), ("requeue", 0)):
        root = base / name
        job = submit(root, f"hang-{name}", restarts)
        wait_done(job)
        runs[name] = hang_figures(root, job)
    (latency, inplace), (latency_rq, requeued) = runs["inplace"], runs["requeue"]
    print(f"detection latency (hung step start -> detected): in place job {latency:.1f} s, "
          f"requeue job {latency_rq:.1f} s (hang_timeout_s={HANG_S}; goal <= {HANG_S + 5})")
    print(f"detected hang -> first resumed step: in place {inplace:.1f} s, requeue "
          f"{requeued:.1f} s: requeue / in place = {requeued / inplace:.2f}x (goal >= 2x)")

    # goodput: one hang (restarted in place) and one preemption (requeued)
    root = base / "goodput"
    job = submit(root, "hang-goodput", 2, GOODPUT_STEPS)
    end = time.monotonic() + 300
    while not any(e["event"] == "step" and e.get("attempt") == 1 and e["step"] >= 60
                  for e in events(root)):
        if time.monotonic() > end:
            raise SystemExit("the goodput job did not get past step 60")
        time.sleep(0.5)
    preempt(job)
    wait_done(job)
    print(goodput(root, job))


def goodput(root: Path, job: str) -> str:
    """Goodput and where the rest of the allocated GPU-time went, from the job's own
    events (rank 0), its ledger and sacct."""
    evs = events(root)
    steps = [e for e in evs if e["event"] == "step"]
    gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:]) if b["step"] == a["step"] + 1]
    step_s = statistics.median(gaps)
    gpus, allocated = 4, elapsed_s(job)
    kept = GOODPUT_STEPS * step_s * gpus
    redone = (len(steps) - GOODPUT_STEPS) * step_s * gpus
    restart = next(e for e in ledger(root, job) if e["kind"] == "restart")
    hung = (float(restart["at"]) - max(e["time"] for e in steps
                                       if e["time"] < float(restart["detected_at"]))) * gpus
    rest = allocated - kept - redone - hung
    runs = slurm("sacct", "-n", "-X", "-D", "-P", "-j", job, "-o", "State").split()
    return (f"goodput, 2x2 job, one hang + one preemption: {kept / allocated:.1%} of "
            f"{allocated:.0f} GPU-s allocated ({GOODPUT_STEPS} steps x {step_s:.2f} s x {gpus} "
            f"GPUs kept); re-done steps {redone / allocated:.1%}, the hang until its restart "
            f"{hung / allocated:.1%}, start-ups, saves and the preemption's grace "
            f"{rest / allocated:.1%}; runs {runs}")


if __name__ == "__main__":
    main()
