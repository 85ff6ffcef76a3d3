"""A 10,000-point sweep on the devcluster (issue 36): submit it, ask its status, preempt
one running point and see it requeued alone, with the figures.

    SLURM_CONF=/var/lib/hpctrain/devcluster/etc/slurm.conf .venv/bin/python benchmarks/sweep_bench.py

The points are a plain bash step (`sleep`) on partition debug, --max-parallel of them at
once (Slurm's MaxArraySize of the devcluster, 1001, splits the sweep into 10 chained
arrays). Timed, each the median of --repeats: `hpctrain sweep` (render 10,000 point
scripts, 10 sbatch calls, the job index), `hpctrain status` (the sweep as one row),
`hpctrain status SWEEP --json` (10,000 rows), against the same commands on a 100-point
sweep submitted in the same run (the baseline: ratios). Then an urgent job on the node of
one running point: that point is REQUEUED (sacct) and no other point is touched; it
waits in the queue again (a requeue resets its submit time, so it comes after the sweep's
other points). The sweeps are cancelled at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path("/var/lib/hpctrain/devcluster/shared")


def run(*argv: str, env: dict | None = None, timeout: float = 900) -> tuple[str, float]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    took = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"{' '.join(argv[:4])}...: exit {res.returncode}: {res.stderr[-2000:]}")
    return res.stdout, took


def hpctrain(*argv: str, env: dict) -> tuple[str, float]:
    return run(sys.executable, "-m", "hpctrain", *argv, env=env)


def spec(root: Path, name: str, sleep_s: int) -> Path:
    path = root / f"{name}.toml"
    path.write_text("\n".join([
        f'name = "{name}"', 'partition = "debug"', "nodes = 1", "gpus_per_node = 1",
        'time = "00:10:00"', f'output = "{root}/{name}-%A_%a.out"', f'workdir = "{root}"',
        "[run]", 'launcher = "srun"',
        f'command = ["bash", "-c", "echo point $P; sleep {sleep_s}"]',
        "[checkpoint]", f'dir = "{root}/ckpt-{name}"', ""]))
    return path


def timed(env: dict, repeats: int, *argv: str) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(repeats):
        out, took = hpctrain(*argv, env=env)
        times.append(took)
    return statistics.median(times), out


def task_states(array: str, task: int) -> list[str]:
    out, _ = run("sacct", "-n", "-P", "--duplicates", "-X", "-j", f"{array}_{task}",
                 "-o", "State")
    return [s for s in out.split() if s]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--baseline", type=int, default=100)
    ap.add_argument("--max-parallel", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = SHARED / f"sweep-bench-{int(time.time())}"
    root.mkdir(parents=True)
    env = {**os.environ, "HPCTRAIN_CACHE_DIR": tempfile.mkdtemp(prefix="sweep-bench-"),
           "HPCTRAIN_JOBS_DIR": str(root / "jobs")}
    out: dict[str, object] = {"points": args.points, "baseline_points": args.baseline}
    sweeps = []
    try:
        for key, n in (("base", args.baseline), ("big", args.points)):
            grid = ",".join(str(i) for i in range(n))
            res, took = hpctrain("sweep", str(spec(root, key, 30)), "--grid",
                                 f"run.env.P={grid}", "--max-parallel",
                                 str(args.max_parallel), "--json", env=env)
            sweep = json.loads(res)
            sweeps.append(sweep)
            out[f"submit_s_{key}"] = round(took, 2)
            out[f"arrays_{key}"] = len(sweep["arrays"])
            t_list, listing = timed(env, args.repeats, "status", "--json")
            out[f"status_s_{key}"] = round(t_list, 3)
            t, text = timed(env, args.repeats, "status", sweep["sweep_id"], "--json")
            out[f"status_sweep_s_{key}"] = round(t, 3)
            out[f"status_sweep_rows_{key}"] = len(json.loads(text)["jobs"])
            if key == "base":      # its points would hold the nodes the big sweep needs
                hpctrain("cancel", sweep["sweep_id"], env=env)
        big = sweeps[-1]
        out["status_sweep_ratio"] = round(out["status_sweep_s_big"] /
                                          out["status_sweep_s_base"], 2)

        # one running point of the big sweep, preempted by an urgent job on its node
        array = big["arrays"][0]["job_id"]
        deadline = time.time() + 300
        while True:
            text, _ = run("squeue", "-h", "-j", array, "-t", "RUNNING", "-o", "%i %N")
            running = [line.split() for line in text.splitlines() if "_" in line]
            running = [(f"{array}_{i.split('_')[1]}", n) for i, n in running]
            if running:
                break
            if time.time() > deadline:
                raise SystemExit("no point of the big sweep started within 5 min")
            time.sleep(2)
        node = running[0][1]
        on_node = sorted(t for t, n in running if n == node)
        time.sleep(5)       # the points' supervisors have started their steps
        t_preempt = time.time()
        # one GPU: Slurm preempts one point of the node to free it, not the node's others
        run("sbatch", "--parsable", "-p", "urgent", f"--nodelist={node}", "--gres=gpu:1",
            "-o", "/dev/null", "--wrap", "sleep 1")

        def requeued_points() -> list[str]:
            text, _ = run("sacct", "-n", "-P", "--duplicates", "-X", "-j", array,
                          "-o", "JobID,State")
            return sorted({line.split("|")[0] for line in text.splitlines()
                           if line.endswith("|REQUEUED")})
        while not (requeued := requeued_points()):
            if time.time() > t_preempt + 120:
                raise SystemExit(f"no point on {node} ({on_node}) requeued within 120 s")
            time.sleep(1)
        out["preempt_to_requeued_s"] = round(time.time() - t_preempt, 1)
        task_id = requeued[0]
        task = int(task_id.split("_")[1])
        # back in the queue: Slurm orders pending tasks by submit time and a requeue
        # resets it, so the point waits behind the sweep's other points (not awaited)
        text, _ = run("squeue", "-h", "-j", task_id, "-o", "%T %r")
        out["preempted_point_now"] = text.strip()
        out["points_on_the_node"] = on_node
        out["preempted_point"] = task_id
        out["requeued_points"] = requeued_points()
        out["requeued_alone"] = out["requeued_points"] == [task_id]
        t_row, text = timed(env, 1, "status", big["sweep_id"], "--json")
        row = next(r for r in json.loads(text)["jobs"] if r["job_id"] == task_id)
        out["status_of_preempted_point"] = {k: row.get(k) for k in ("state", "requeues")}
    finally:     # whatever was queued, also by a sweep that failed half-way
        for name in ("base", "big"):
            run("scancel", "--me", f"--name={name}")
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
