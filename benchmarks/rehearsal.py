"""The scale rehearsal (issue 36): a 64-node job on the devcluster, run as root.

    .venv/bin/python benchmarks/rehearsal.py [--nodes 64] [--ranks-per-node 2] [--json out]

It reshapes the devcluster to --nodes emulated nodes (one slurmd each; `hpctrain
devcluster up --nodes N --spare 0`), submits one job over all of them with `hpctrain
submit`: --ranks-per-node torch-free stand-in ranks per node
(tests/programs/standin_rank.py: the runtime's real progress reporter, relay and channel;
a recorded-behaviour stand-in for torch.distributed's all-reduce). Then:

- a hang: one rank on a node in the middle stops outside any collective at step 10 of the
  first attempt, every other rank waits for it in the all-reduce. Measured: detection
  latency (the hang's start, logged by the rank, to the supervisor's ``detected_at`` in the
  ledger; goal <= hang_timeout_s + 5 s), and whether the rank is named;
- the step restarted in the allocation (new processes), then a preemption: an urgent job
  on all the nodes; the job is requeued and completes;
- all along: file events under the job's checkpoint directory (inotify; the state
  directory is there), and the supervisor's CPU time (/proc, every batch step process of
  the job; the emulated nodes are this machine's processes);
- every loop, `hpctrain status JOB --json`: how old the step it shows is (the live query,
  tests/helpers/lag.py), against rank 0's history.

At the end the devcluster is brought back to its default shape (unless --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from helpers.inotify import Inotify  # noqa: E402
from helpers.lag import Poll, staleness  # noqa: E402

from hpctrain import protocol  # noqa: E402
from hpctrain.spec.model import JobSpec  # noqa: E402

SHARED = Path("/var/lib/hpctrain/devcluster/shared")
HANG_TIMEOUT_S, HANG_STEP, STEPS, STEP_S = 10, 10, 80, 0.5


def run(*argv: str, timeout: float = 600) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if res.returncode:
        raise SystemExit(f"{' '.join(argv[:5])}: exit {res.returncode}: {res.stderr[-3000:]}")
    return res.stdout


def hpctrain(*argv: str, timeout: float = 900) -> str:
    return run(sys.executable, "-m", "hpctrain", *argv, timeout=timeout)


def state(job: str) -> str:
    out = run("sacct", "-X", "-n", "-P", "-j", job, "-o", "State").split()
    return out[-1] if out else ""


def supervisor_cpu(job: str, seen: dict[int, float]) -> None:
    """Each of the job's supervisor processes' CPU seconds so far, by pid (kept when it
    is gone: the last sample)."""
    tick = os.sysconf("SC_CLK_TCK")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            if b"hpctrain.supervisor" not in cmd:
                continue
            env = (d / "environ").read_bytes().split(b"\0")
            if f"SLURM_JOB_ID={job}".encode() not in env:
                continue
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            seen[int(d.name)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue


def spec_text(root: Path, nodes: int, per_node: int) -> str:
    hung = (nodes // 2) * per_node + per_node - 1     # the last rank of a middle node
    command = [sys.executable, str(ROOT / "tests" / "programs" / "standin_rank.py"),
               "--steps", str(STEPS), "--step-s", str(STEP_S), "--hang",
               f"{hung}:{HANG_STEP}", "--events", str(root / "events.jsonl")]
    return JobSpec.from_dict({
        "name": "rehearsal", "partition": "debug", "nodes": nodes,
        "gpus_per_node": per_node, "time": "00:30:00", "output": f"{root}/job-%j.out",
        "workdir": str(root), "layout": {"dp": nodes * per_node},
        "run": {"launcher": "srun", "command": command},
        "checkpoint": {"dir": str(root / "ckpt")},
        "watchdog": {"hang_timeout_s": HANG_TIMEOUT_S}}).to_toml()


def site_partitions(root: Path, nodes: int, gpus: int) -> Path:
    """The sysadmin's side of the reshape: partition facts that say debug and urgent now
    have ``nodes`` nodes of ``gpus`` GPUs (a site directory on HPCTRAIN_TEMPLATES shadows
    the built-in)."""
    site = root / "site-templates"
    (site / "partitions").mkdir(parents=True)
    builtin = ROOT / "templates" / "devcluster" / "partitions"
    for name in ("debug", "urgent"):
        text = (builtin / f"{name}.toml").read_text()
        text = re.sub(r"(?m)^max_nodes = \d+$", f"max_nodes = {nodes}", text)
        text = re.sub(r"(?m)^gpus_per_node = \d+$", f"gpus_per_node = {gpus}", text)
        (site / "partitions" / f"{name}.toml").write_text(text)
    return site


def events(root: Path) -> list[dict]:
    path = root / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def rehearse(nodes: int, per_node: int) -> dict:
    root = SHARED / f"rehearsal-{int(time.time())}"
    (root / "ckpt").mkdir(parents=True)
    os.environ["HPCTRAIN_TEMPLATES"] = str(site_partitions(root, nodes, max(2, per_node)))
    (root / "job.toml").write_text(spec_text(root, nodes, per_node))
    counter = Inotify(root / "ckpt")
    t_submit = time.time()
    job = json.loads(hpctrain("submit", str(root / "job.toml"), "--json"))["job_id"]
    cpu: dict[int, float] = {}
    marks: dict[str, float] = {}
    polls: list[Poll] = []
    preempted = False
    while True:
        counter.read()
        supervisor_cpu(job, cpu)
        row = json.loads(hpctrain("status", job, "--json"))["jobs"][0]
        if row["state"] == "RUNNING" and row["progress_source"] == "supervisor":
            polls.append(Poll(time.time(), row["progress_step"], "supervisor"))
        evs = events(root)
        starts = [e for e in evs if e["event"] == "start"]
        if starts and "first_start" not in marks:
            marks["first_start"] = starts[0]["time"]
        if not preempted and any(e["attempt"] == 1 for e in starts):
            marks.setdefault("attempt1", max(e["time"] for e in starts if e["attempt"] == 1))
            if time.time() > marks["attempt1"] + 15:
                marks["preempt"] = time.time()
                where = run("squeue", "-h", "-j", job, "-o", "%N").strip()
                run("sbatch", "-p", "urgent", "-N", str(nodes), f"--nodelist={where}",
                    f"--gres=gpu:{per_node}", "-o", "/dev/null", "--wrap", "sleep 1")
                preempted = True
        now_state = state(job)
        if now_state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}:
            break
        if time.time() - t_submit > 1500:
            run("scancel", job)
            raise SystemExit(f"job {job} did not end within 25 min (state {now_state})")
        time.sleep(1.0)
    t_end = time.time()
    counter.read()
    log = (root / f"job-{job}.out").read_text(errors="replace")
    ckpt = root / "ckpt"
    ledger = (protocol.state_dir(ckpt, job) / protocol.LEDGER).read_text()
    hang = next(e for e in events(root) if e["event"] == "hang")
    detected = float(re.search(r"restart cause=hang .*?detected_at=([\d.]+)", ledger)[1])
    named = re.search(r"HANG: stopped first: rank\(s\) (\S+) on (\S+)", log)
    states = run("sacct", "-n", "-P", "-j", job, "-o", "State", "--duplicates", "-X").split()
    training = (marks["attempt1"] + 3, marks["preempt"] - 1)
    lag = status_lag(polls, protocol.read_history(protocol.state_dir(ckpt, job)))
    return {
        "status_lag_s": lag,
        "job": job, "nodes": nodes, "ranks": nodes * per_node, "state": now_state,
        "states": states, "hang_rank": hang["rank"], "hang_node": hang["node"],
        "named": named.group(0) if named else "",
        "detection_s": round(detected - hang["time"], 1),
        "detection_goal_s": HANG_TIMEOUT_S + 5,
        "submit_to_first_start_s": round(marks["first_start"] - t_submit, 1),
        "wall_s": round(t_end - t_submit, 1),
        "supervisor_cpu_s": round(sum(cpu.values()), 2),
        "supervisor_cpu_share": round(sum(cpu.values()) / (t_end - t_submit), 4),
        "file_events": counter.count,
        "file_events_per_s_whole_job": round(counter.count / (t_end - t_submit), 3),
        "file_events_per_s_training": round(counter.rate(*training), 3),
        # without the opens: what the job changed (status's polls open its files to read)
        "file_changes_per_s_training": round(counter.rate(*training, opens=False), 3),
        "opens": counter.opens,
        "busiest_files": sorted(counter.names.items(), key=lambda kv: -kv[1])[:6],
        "root": str(root),
    }


def status_lag(polls: list[Poll], history: list[dict]) -> dict:
    """How old the step `hpctrain status` showed was, as the job ran: each attempt's steps
    as rank 0's history marks them begun (a step is over once the next one began); polls
    in a restart or a requeue are left out (the step numbers start again there)."""
    begun: dict[tuple, dict[int, float]] = {}
    for e in history:
        if e.get("event") == "step" and isinstance(e.get("step"), int):
            begun.setdefault((e["restart"], e["attempt"]), {})[e["step"]] = e["t"]
    mine = []
    for steps in begun.values():
        first, last = min(steps.values()), max(steps.values())
        done_at = {step - 1: t for step, t in steps.items()}
        mine += [(p, done_at) for p in polls if first <= p.at <= last]
    ages = sorted(staleness(p, done) for p, done in mine)
    return {"polls": len(ages), "median_s": round(ages[len(ages) // 2], 2) if ages else None,
            "worst_s": round(ages[-1], 2) if ages else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="leave the devcluster in that shape")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    t0 = time.time()
    hpctrain("devcluster", "up", "--nodes", str(args.nodes), "--spare", "0",
             "--gpus-per-node", str(max(2, args.ranks_per_node)))
    reshape_s = time.time() - t0
    try:
        out = rehearse(args.nodes, args.ranks_per_node)
    finally:
        if not args.keep:
            hpctrain("devcluster", "up")
    out["reshape_s"] = round(reshape_s, 1)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
