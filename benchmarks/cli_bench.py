"""CLI speed on a login node, and sweep submission against one-sbatch-per-point.

    SLURM_CONF=/var/lib/hpctrain/devcluster/etc/slurm.conf .venv/bin/python benchmarks/cli_bench.py

Measures, in one run, against baselines taken in the same run:

1. ``hpctrain render SPEC`` and ``hpctrain status`` (100 recorded jobs: one held job
   array of 100 tasks, so the cluster runs nothing) wall time, against ``python -c pass``,
   the three taken in turn (medians; one warm-up run each: .pyc files and the template
   cache exist on a login node after the first command);
2. submitting a 1000-point sweep (``hpctrain sweep --grid ...``: renders 1000 scripts,
   ONE ``sbatch --array``) against 1000 single ``sbatch`` calls of one rendered script.
   Every job is submitted with ``--hold`` so the devcluster is not flooded, and all
   are cancelled at the end (one scancel call each side). ``--test-only`` would skip
   the controller's real work (job records, the accounting database), so it would
   flatter the single-sbatch side.

Prints a table and ratios; ``--json`` prints one JSON object. Needs the devcluster
(``hpctrain devcluster up``) for parts 1 (status) and 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SHARED = Path("/var/lib/hpctrain/devcluster/shared")
SPEC = """name = "bench"
partition = "debug"
nodes = 1
gpus_per_node = 1
time = "00:05:00"
output = "/dev/null"
[sbatch]
hold = true
[run]
launcher = "srun"
command = ["bash", "-c", "echo $P"]
"""


def run_once(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run of argv (it must succeed)."""
    t = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {res.stderr}")
    return elapsed


def interleaved(commands: dict[str, list[str]], env: dict[str, str], runs: int) -> dict[str, float]:
    """Median wall seconds of each command, runs taken in turn (a, b, c, a, b, c, ...) after
    one warm-up each, so a noisy neighbour slows every command alike, not one of them."""
    for argv in commands.values():
        run_once(argv, env)   # warm: .pyc files and the template cache, as on a login node
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            times[name].append(run_once(argv, env))
    return {name: statistics.median(ts) for name, ts in times.items()}


def sbatch(args: list[str], env: dict[str, str]) -> str:
    res = subprocess.run(["sbatch", "--parsable", *args], env=env, capture_output=True,
                         text=True, check=True)
    return res.stdout.strip().split(";")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="runs per CLI timing (median kept)")
    ap.add_argument("--points", type=int, default=1000, help="sweep size")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-", dir=SHARED if SHARED.is_dir() else None))
    spec = work / "bench.toml"
    spec.write_text(SPEC)
    env = {**os.environ, "HPCTRAIN_CACHE_DIR": str(work / "cache"),
           "HPCTRAIN_JOBS_DIR": str(work / "jobs")}
    # the console script users run (python -m adds runpy's cost), from this interpreter's venv
    script = Path(PY).with_name("hpctrain")
    hp = [str(script)] if script.is_file() else [PY, "-m", "hpctrain"]
    results: dict[str, float] = {}

    # 1. CLI wall time vs interpreter start, interleaved
    array = sbatch(["--hold", "--array=0-99", "--output=/dev/null", "--wrap", "true"], env)
    try:
        from hpctrain.jobs import index  # record the 100 tasks as the user's jobs
        os.environ["HPCTRAIN_CACHE_DIR"] = env["HPCTRAIN_CACHE_DIR"]
        index.append([index.JobEntry(f"{array}", "held", "sweep", str(work), sweep_id=array,
                                     num_tasks=100)])
        time.sleep(2)  # let accounting see the array
        results.update(interleaved({
            "python -c pass": [PY, "-c", "pass"],
            "hpctrain render": [*hp, "render", str(spec)],
            "hpctrain status (100 jobs)": [*hp, "status", "--expand"]}, env, args.runs))
    finally:
        subprocess.run(["scancel", array], env=env, check=False)

    # 2. sweep of N points vs N single sbatch calls
    values = ",".join(str(i) for i in range(args.points))
    t = time.perf_counter()
    res = subprocess.run([*hp, "sweep", str(spec), "--grid", f"run.env.P={values}", "--json"],
                         env=env, capture_output=True, text=True)
    results[f"hpctrain sweep ({args.points} points)"] = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"sweep failed: {res.stderr}")
    sweep_ids = [a["job_id"] for a in json.loads(res.stdout)["arrays"]]
    subprocess.run(["scancel", *sweep_ids], env=env, check=False)

    rendered = work / "one.sh"
    rendered.write_text(subprocess.run([*hp, "render", str(spec)], env=env, capture_output=True,
                                       text=True, check=True).stdout)
    ids = []
    t = time.perf_counter()
    for _ in range(args.points):
        ids.append(sbatch([str(rendered)], env))
    results[f"{args.points} x sbatch"] = time.perf_counter() - t
    subprocess.run(["scancel", *ids], env=env, check=False)

    shutil.rmtree(work, ignore_errors=True)  # the jobs were cancelled; nothing reads it now
    base = results["python -c pass"]
    ratios = {
        "render / python -c pass": results["hpctrain render"] / base,
        "status(100) / python -c pass": results["hpctrain status (100 jobs)"] / base,
        f"{args.points} x sbatch / sweep": results[f"{args.points} x sbatch"]
        / results[f"hpctrain sweep ({args.points} points)"],
    }
    if args.json:
        print(json.dumps({"seconds": results, "ratios": ratios}))
    else:
        for k, v in results.items():
            print(f"{k:<34} {v * 1000:10.1f} ms")
        for k, v in ratios.items():
            print(f"{k:<34} {v:10.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
