"""What a crash, a hang and a preemption cost when a failed attempt restarts in the running
processes (``hpctrain.runtime.run`` with snapshots in memory), against the cold restart in
new processes in the same allocation, measured in one run; then the goodput of a ~10-minute
2x2 job through one crash, one hang and one preemption, as ``hpctrain report`` gives it and
as this benchmark counts it from the job's own step log.

    SLURM_CONF=/var/lib/hpctrain/devcluster/etc/slurm.conf .venv/bin/python benchmarks/inprocess_bench.py
    # the per-launcher table alone (docs/fault-recovery.md), 3 jobs per cell:
    .venv/bin/python benchmarks/inprocess_bench.py --launchers srun,torchrun,deepspeed --no-goodput

The job is examples/train_gpt.py on 2 nodes x 2 fake GPUs, dp=4 under each of --launchers
(srun, torchrun, deepspeed; the goodput run under the first), submitted with
`hpctrain submit`; rank 1 raises before step C of attempt 0 and rank 2 sleeps (a Python
hang: the others wait in the step's all-reduce) before step H of attempt 1;
hang_timeout_s=10 for both kinds, so the detection is the same and the difference is the
restart. The two kinds differ only in ``--inprocess --snapshot-every 1``:

- cold: the supervisor kills nothing after a crash (the step ended), restarts the step in
  new processes (max_crash_restarts=1), and after a hang kills the step and does the same:
  import, rendezvous, load from storage;
- in-process: the ranks leave the failed attempt, meet again on a fresh store prefix and
  resume from the snapshot in memory.

Figures (medians over --repeat jobs of each kind, interleaved, with their range): the
*recovery*, from the last step before the failure to the first step after it (``hpctrain
report``'s "back in"); for the hang also from its detection (the ledger's detected_at) to
the first step after it; and the job's first start (Slurm start -> first step, the cold
start every restart in new processes repeats). They are printed as one markdown table, a
row per launcher and figure, headed by the command, the date, the machine and N, ready to
paste into docs/fault-recovery.md. The hang is found by ``hang_timeout_s`` alone (no
``collective_timeout_s``): the hung rank is stopped in Python, its peers are freed from the
all-reduce by the group's abort (in-process) or by the step's kill (cold).
Goals: a crash <= 3 s, a hang <= detection + 3 s, goodput >= 90% with the report and this
count within 2 points. Needs the devcluster (or a GPU partition: --partition, --shared,
--nodes, --gpus-per-node) and an idle queue; on the 2-core devcluster about 5 minutes per
launcher with --repeat 3, and 20-25 minutes more for the goodput run (--no-goodput skips it).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANG_S, CRASH_AT, HANG_AT, SAVE_EVERY, STEP_SLEEP = 10, 12, 25, 20, 0.2
SHORT_STEPS = 45      # the recovery jobs: past both faults, a little more


@dataclass(frozen=True)
class Where:
    """Where the jobs run: the devcluster's names by default, a GPU partition's when given."""

    partition: str = "debug"
    preempt_partition: str = "urgent"    # a partition whose jobs preempt ``partition``'s
    shared: Path = Path("/var/lib/hpctrain/devcluster/shared")
    nodes: int = 2
    gpus_per_node: int = 2

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def slurm(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def hpctrain(*argv: str, cwd: Path | None = None) -> str:
    return subprocess.run([sys.executable, "-m", "hpctrain", *argv], capture_output=True,
                          text=True, check=True, timeout=120, cwd=cwd).stdout


def submit(where: Where, root: Path, name: str, steps: int, inprocess: bool,
           minutes: int = 20, launcher: str = "srun") -> str:
    """One train_gpt job, faults included; its job id."""
    root.mkdir(parents=True)
    cmd = [sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--steps", str(steps),
           "--save-every", str(SAVE_EVERY), "--seed", "11", "--step-sleep", str(STEP_SLEEP),
           "--ckpt-dir", str(root / "ckpt"), "--log-file", str(root / "loss.jsonl"),
           "--fault", f"crash@{CRASH_AT}:1:0", "--fault", f"hang@{HANG_AT}:2:1"]
    if inprocess:
        cmd += ["--inprocess", "--snapshot-every", "1"]
    (root / "job.toml").write_text("\n".join([
        f'name = "{name}"', f'partition = "{where.partition}"', f"nodes = {where.nodes}",
        f"gpus_per_node = {where.gpus_per_node}",
        f'time = "00:{minutes + 10:02d}:00"', f'output = "{root}/job-%j.out"',
        f'workdir = "{root}"', "[layout]", f"dp = {where.gpus}", "[run]",
        f'launcher = "{launcher}"',
        f"command = {json.dumps(cmd)}", 'env = { OMP_NUM_THREADS = "1" }',
        "[checkpoint]", f'dir = "{root}/ckpt"',
        "[requeue]", "max_crash_restarts = 2", "max_hangs = 2", 'signal = "USR2"',
        "signal_lead_s = 60",
        "[watchdog]", f"hang_timeout_s = {HANG_S}", "max_step_restarts = 4", ""]))
    return json.loads(hpctrain("submit", str(root / "job.toml"), "--json", cwd=root))["job_id"]


def wait_done(job: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while slurm("squeue", "-h", "-j", job, "-o", "%T").strip():
        if time.monotonic() > end:
            raise SystemExit(f"job {job} did not finish within {timeout:.0f} s")
        time.sleep(2)
    states = slurm("sacct", "-n", "-X", "-D", "-P", "-j", job, "-o", "State").split()
    if states[-1:] != ["COMPLETED"]:
        raise SystemExit(f"job {job} ended {states}: see its log")


def steps(root: Path) -> list[dict]:
    lines = (root / "loss.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r]


def report(root: Path, job: str) -> dict:
    return json.loads(hpctrain("report", job, "--json", "--dir", str(root / "ckpt")))


def hang_detected_at(root: Path, job: str) -> float:
    ledger = root / "ckpt" / ".hpctrain" / "jobs" / job / "ledger"
    for line in ledger.read_text().splitlines():
        fields = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
        if line.startswith("restart ") and fields.get("cause") == "hang":
            return float(fields["detected_at"])
    raise SystemExit(f"job {job}: no hang restart in its ledger")


def recoveries(root: Path, job: str) -> dict[str, float]:
    """{crash, hang, hang after detection, start-up of the job}: seconds."""
    r = report(root, job)
    attempts = r["runs"][0]["attempts"]
    crash, hang = attempts[1], attempts[2]
    detected = hang_detected_at(root, job)
    after = [s["time"] for s in steps(root) if s["time"] > detected]
    step_s = r["step_s"]
    return {"crash": crash["recovery_s"], "hang": hang["recovery_s"],
            "hang after detection": min(after) - step_s - detected,
            "start-up": attempts[0]["seconds"]["startup"]}


def own_goodput(where: Where, root: Path, job: str, total: int) -> float:
    """The job's own count: every step kept once (total) x the median step time x GPUs,
    over the GPU-seconds sacct says were allocated."""
    times = [s["time"] for s in steps(root)]
    step_s = statistics.median(b - a for a, b in zip(times, times[1:]) if 0 < b - a < 5)
    allocated = 0.0
    for line in slurm("sacct", "-n", "-X", "-D", "-P", "-j", job, "-o",
                      "ElapsedRaw,AllocTRES").splitlines():
        raw, tres = line.split("|")
        gpus = next((int(t.split("=")[1]) for t in tres.split(",")
                     if t.startswith("gres/gpu=")), 1)
        allocated += int(raw) * gpus
    return total * step_s * where.gpus / allocated


def preempt_after(where: Where, root: Path, job: str, step: int, timeout: float) -> None:
    """Once the job passed ``step``, a job of the preempting partition takes its nodes (it
    is requeued)."""
    end = time.monotonic() + timeout
    while not (root / "loss.jsonl").exists() or all(s["step"] < step for s in steps(root)):
        if time.monotonic() > end:
            raise SystemExit(f"job {job} did not reach step {step}")
        time.sleep(1)
    nodes = slurm("squeue", "-h", "-j", job, "-o", "%N").strip()
    slurm("sbatch", "-p", where.preempt_partition, f"--nodelist={nodes}", "-N",
          str(where.nodes), f"--gres=gpu:{where.gpus_per_node}", "-o", "/dev/null", "--wrap",
          "sleep 1")


def goodput_job(where: Where, base: Path, name: str, total: int, inprocess: bool,
                minutes: int, launcher: str) -> tuple[float, float, dict]:
    root = base / name
    job = submit(where, root, name, total, inprocess, minutes, launcher)
    preempt_after(where, root, job, int(total * 0.6), minutes * 60 + 300)
    wait_done(job, minutes * 60 + 600)
    r = report(root, job)
    return r["goodput"], own_goodput(where, root, job, total), r


Figures = Mapping[str, Mapping[str, Sequence[Mapping[str, float]]]]
"""{launcher: {"cold" | "inprocess": [one job's recoveries(), ...]}}"""

# (key in recoveries(), what the table's row says, the in-process goal in seconds or None)
ROWS = (("crash", "a crash on one rank", 3.0),
        ("hang", f"a Python hang, `hang_timeout_s = {HANG_S}` alone (no `collective_timeout_s`)",
         None),
        ("hang after detection", "the same hang, from its detection", 3.0))


def recovery_figures(where: Where, base: Path, launcher: str,
                     repeat: int) -> dict[str, list[dict[str, float]]]:
    """The crash and hang recoveries under ``launcher``, in-process and cold, ``repeat`` jobs
    of each kind, interleaved (the machine drifts between runs)."""
    figures: dict[str, list[dict[str, float]]] = {"cold": [], "inprocess": []}
    for i in range(repeat):
        for kind in figures:
            root = base / f"{launcher}-{kind}-{i}"
            job = submit(where, root, f"bench-{kind}", SHORT_STEPS, kind == "inprocess",
                         launcher=launcher)
            wait_done(job, 900)
            figures[kind].append(recoveries(root, job))
            print(f"{launcher} {kind} {i + 1}/{repeat}: job {job}: " + ", ".join(
                f"{k} {v:.1f} s" for k, v in figures[kind][-1].items()), file=sys.stderr,
                flush=True)
    return figures


def _cell(values: Sequence[float]) -> str:
    """'12.8 s (12.1-13.5)': the median and the range (the range only for 2 or more)."""
    med = statistics.median(values)
    if len(values) < 2:
        return f"{med:.1f} s"
    return f"{med:.1f} s ({min(values):.1f}-{max(values):.1f})"


def recovery_table(figures: Figures) -> str:
    """The per-launcher markdown table of ``figures``: a row per launcher and recovery
    (in-process against cold, medians and ranges, their ratio), then the launcher's first
    start (cold only: both kinds' jobs start the same way, so all of them count). Pure."""
    lines = ["| launcher | from the last step before to the first step after | in-process: "
             "median (range) | cold, new processes in the same allocation: median (range) | "
             "cold / in-process |", "|---|---|---|---|---|"]
    for launcher, kinds in figures.items():
        cold, warm = kinds["cold"], kinds["inprocess"]
        for key, what, goal in ROWS:
            c = [f[key] for f in cold]
            w = [f[key] for f in warm]
            wm = statistics.median(w)
            ratio = f"{statistics.median(c) / wm:.1f}x" if wm > 0 else "n/a"
            aim = f" (goal <= {goal:.0f} s)" if goal is not None else ""
            lines.append(f"| {launcher} | {what} | {_cell(w)}{aim} | {_cell(c)} | {ratio} |")
        starts = [f["start-up"] for kind in (cold, warm) for f in kind]
        lines.append(f"| {launcher} | not a recovery: the job's first start (Slurm start -> "
                     f"first step; {len(starts)} jobs) | | {_cell(starts)} | |")
    return "\n".join(lines)


def caption(where: Where, argv: Sequence[str], repeat: int, today: datetime.date,
            torch_version: str, cpus: int | None) -> str:
    """The line above the table: the command, the date, the machine, N. Pure."""
    command = shlex.join(["python", "benchmarks/inprocess_bench.py", *argv])
    return (f"`{command}`, {today.isoformat()}, {cpus or '?'}-core machine, torch {torch_version}: "
            f"examples/train_gpt.py on {where.nodes} nodes x {where.gpus_per_node} ranks "
            f"(dp={where.gpus}), partition {where.partition}, a crash on rank 1 before step "
            f"{CRASH_AT} and a Python hang of rank 2 before step {HANG_AT}, "
            f"`hang_timeout_s = {HANG_S}`; medians of {repeat} job(s) per cell, each kind's "
            f"jobs interleaved")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=int, default=10,
                    help="how long the goodput job trains undisturbed (default 10)")
    ap.add_argument("--no-goodput", action="store_true", help="only the recovery figures")
    ap.add_argument("--repeat", type=int, default=3,
                    help="recovery jobs of each kind; the figures are medians (default 3)")
    ap.add_argument("--partition", default=Where.partition)
    ap.add_argument("--preempt-partition", default=Where.preempt_partition,
                    help="a partition whose jobs preempt --partition's (the goodput run)")
    ap.add_argument("--shared", type=Path, default=Where.shared,
                    help="a directory every node sees (checkpoints and logs go under it)")
    ap.add_argument("--nodes", type=int, default=Where.nodes)
    ap.add_argument("--gpus-per-node", type=int, default=Where.gpus_per_node)
    ap.add_argument("--launchers", default="srun,torchrun,deepspeed",
                    help="the recovery figures for each of these launchers (comma list; "
                    "the goodput run uses the first)")
    args = ap.parse_args()
    launchers = args.launchers.split(",")
    where = Where(args.partition, args.preempt_partition, args.shared, args.nodes,
                  args.gpus_per_node)
    base = Path(tempfile.mkdtemp(prefix="inprocess-bench-", dir=where.shared))
    figures = {launcher: recovery_figures(where, base, launcher, args.repeat)
               for launcher in launchers}
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "?"
    print(caption(where, sys.argv[1:], args.repeat, datetime.date.today(), torch_version,
                  os.cpu_count()))
    print()
    print(recovery_table(figures))
    print(flush=True)
    if args.no_goodput:
        return
    done = steps(base / f"{launchers[0]}-cold-0")
    step_s = statistics.median(b["time"] - a["time"] for a, b in zip(done, done[1:])
                               if 0 < b["time"] - a["time"] < 5)
    total = max(100, int(args.minutes * 60 / step_s))
    results = {kind: goodput_job(where, base, f"goodput-{kind}", total, kind == "inprocess",
                                 args.minutes, launchers[0]) for kind in ("cold", "inprocess")}
    for kind, (by_report, by_count, r) in results.items():
        print(f"goodput, {kind}, {total} steps (~{args.minutes} min) through one crash, one "
              f"hang, one preemption: {by_report:.1%} (hpctrain report), {by_count:.1%} "
              f"(the job's own count; {abs(by_report - by_count) * 100:.1f} points apart) of "
              f"{r['allocated_gpu_s']:.0f} GPU-s")
    warm_g, cold_g = results["inprocess"][0], results["cold"][0]
    print(f"goodput in-process / cold = {warm_g / cold_g:.2f}x (goal: in-process >= 90%)")


if __name__ == "__main__":
    main()
