"""What a lost node costs with a spare node in the allocation (``[elastic] spare_nodes = 1``),
with a shrink instead (``[elastic] min_nodes = 1``: no spare, the step goes on on the node
left) and with neither (Slurm ends the run NODE_FAIL and requeues it), measured in one run
on the same partition.

    SLURM_CONF=/var/lib/hpctrain/devcluster/etc/slurm.conf .venv/bin/python benchmarks/elastic_bench.py

Both jobs are examples/train_gpt.py, dp=4 under srun on 2 nodes x 2 fake GPUs of the
devcluster's partition ``wide`` (n1-n3), submitted with ``hpctrain submit``, trained for
about --minutes. Halfway, n2 is lost for real: its slurmd and every process it started are
killed (-9), as tests/cluster/test_recovery_cluster.py does (this needs root and the
devcluster; no other job may run). Slurm notices by itself (SlurmdTimeout).

- spare: the supervisor finds n2's ranks silent, takes n2 from the job, ends the step and
  starts it again on n1 and the spare n3 in the same allocation;
- shrink: the supervisor finds n2's ranks silent, takes n2 from the job and starts the
  step again on n1 alone at dp=2, each rank taking two replicas' batches (the global batch
  kept: each step takes twice as long on half the GPUs);
- requeue: Slurm marks n2 DOWN, ends the run NODE_FAIL and requeues the job, which runs
  again on n1 and n3.

Figures: seconds from the loss to the first resumed step; goodput as ``hpctrain report``
gives it (the spare's GPUs are allocated the whole time: they count against it) and the
job's own count (every step once x the median step time x the 4 step GPUs, over the GPU-
seconds sacct says were allocated; the step time is the median before the loss: a shrunk
step's GPU-seconds are the same). Goal: loss -> first step <= 30 s with a spare or a shrink.
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
sys.path.insert(0, str(ROOT / "tests"))   # the recorded way to lose a devcluster node
from helpers import admin  # noqa: E402
from helpers.nodes import lose_node  # noqa: E402

SHARED = Path("/var/lib/hpctrain/devcluster/shared")
SAVE_EVERY, STEP_SLEEP, STEP_S = 20, 0.2, 0.3     # STEP_S: about, to size the job
LOST = "n2"
ELASTIC = {"spare": "spare_nodes = 1", "shrink": "min_nodes = 1", "requeue": ""}


def slurm(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def hpctrain(*argv: str, cwd: Path | None = None) -> str:
    return subprocess.run([sys.executable, "-m", "hpctrain", *argv], capture_output=True,
                          text=True, check=True, timeout=120, cwd=cwd).stdout


def submit(root: Path, name: str, total: int, elastic: str) -> str:
    root.mkdir(parents=True)
    cmd = [sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--steps", str(total),
           "--save-every", str(SAVE_EVERY), "--seed", "11", "--step-sleep", str(STEP_SLEEP),
           "--ckpt-dir", str(root / "ckpt"), "--log-file", str(root / "loss.jsonl")]
    lines = [f'name = "{name}"', 'partition = "wide"', "nodes = 2", "gpus_per_node = 2",
             'time = "00:40:00"', f'output = "{root}/job-%j.out"', f'workdir = "{root}"',
             "[layout]", "dp = 4", "[run]", 'launcher = "srun"',
             f"command = {json.dumps(cmd)}", 'env = { OMP_NUM_THREADS = "1" }',
             "[checkpoint]", f'dir = "{root}/ckpt"', "[requeue]", 'signal = "USR2"',
             "signal_lead_s = 60"]
    if elastic:
        lines += ["[elastic]", elastic]
    (root / "job.toml").write_text("\n".join(lines) + "\n")
    return json.loads(hpctrain("submit", str(root / "job.toml"), "--json", cwd=root))["job_id"]


def steps(root: Path) -> list[dict]:
    path = root / "loss.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if "loss" in r]


def wait_done(job: str, timeout: float) -> list[str]:
    end = time.monotonic() + timeout
    while slurm("squeue", "-h", "-j", job, "-o", "%T").strip():
        if time.monotonic() > end:
            raise SystemExit(f"job {job} did not finish within {timeout:.0f} s")
        time.sleep(2)
    states = slurm("sacct", "-n", "-X", "-D", "-P", "-j", job, "-o", "State").split()
    if states[-1:] != ["COMPLETED"]:
        raise SystemExit(f"job {job} ended {states}: see its log")
    return states


def own_goodput(root: Path, job: str, total: int, lost_at: float) -> tuple[float, float]:
    """(goodput, the spare's share of the allocated GPU-seconds)."""
    times = [s["time"] for s in steps(root) if s["time"] < lost_at]
    step_s = statistics.median(b - a for a, b in zip(times, times[1:]) if 0 < b - a < 5)
    allocated = spare = 0.0
    for line in slurm("sacct", "-n", "-X", "-D", "-P", "-j", job, "-o",
                      "ElapsedRaw,AllocTRES").splitlines():
        raw, tres = line.split("|")
        gpus = next((int(t.split("=")[1]) for t in tres.split(",")
                     if t.startswith("gres/gpu=")), 1)
        allocated += int(raw) * gpus
        spare += int(raw) * max(gpus - 4, 0)
    return total * step_s * 4 / allocated, spare / allocated


def one_job(base: Path, kind: str, total: int) -> dict:
    root, dev = base / kind, admin.Cluster()
    job = submit(root, f"elastic-{kind}", total, ELASTIC[kind])
    end = time.monotonic() + total * STEP_S * 4 + 300
    while max((s["step"] for s in steps(root)), default=0) < total // 2:
        if time.monotonic() > end:
            raise SystemExit(f"job {job} did not reach step {total // 2}")
        time.sleep(0.5)
    lose_node(dev, LOST, job)
    t_lost = time.time()
    try:
        states = wait_done(job, total * STEP_S * 4 + 600)
    finally:
        dev.make_nodes_usable()
    first = min(s["time"] for s in steps(root) if s["time"] > t_lost)
    report = json.loads(hpctrain("report", job, "--json", "--dir", str(root / "ckpt")))
    goodput, spare_share = own_goodput(root, job, total, t_lost)
    return {"job": job, "states": states, "to_first_step": first - t_lost,
            "report": report["goodput"], "own": goodput, "spare_share": spare_share}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10,
                    help="how long each job trains undisturbed (default 10)")
    args = ap.parse_args()
    total = int(args.minutes * 60 / STEP_S)
    with tempfile.TemporaryDirectory(dir=SHARED, prefix="elastic-bench-") as tmp:
        results = {kind: one_job(Path(tmp), kind, total) for kind in ELASTIC}
    for kind, r in results.items():
        print(f"{kind:8s} job {r['job']} {'/'.join(r['states'])}: node loss -> first "
              f"resumed step {r['to_first_step']:.1f} s; goodput {r['report']:.1%} "
              f"(report) / {r['own']:.1%} (own count); spare GPUs' share of the allocation "
              f"{r['spare_share']:.1%}")
    requeue = results["requeue"]
    for kind in ("spare", "shrink"):
        print(f"loss -> first step, {kind} / requeue = "
              f"{results[kind]['to_first_step'] / requeue['to_first_step']:.2f}x; goodput "
              f"(report) {kind} / requeue = {results[kind]['report'] / requeue['report']:.2f}x "
              f"(goal: {kind} <= 30 s)")


if __name__ == "__main__":
    main()
