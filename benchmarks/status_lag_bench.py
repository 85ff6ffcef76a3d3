"""How old is the step ``hpctrain status`` shows? The live query against the summary file it
replaced, measured on one job in the same run (issue 43); and what an answer costs the
supervisor as the job grows.

    .venv/bin/python benchmarks/status_lag_bench.py [--steps 60] [--step-s 0.5]
                                                    [--ranks 8,8192] [--json out]

A job of tests/programs/runtime_steps.py on 2 nodes x 2 fake GPUs (srun, the runtime's
real progress reporter, relay and supervisor) logs the time each step is done. Every
second ``hpctrain status JOB --json`` runs as a user runs it (a new process): the step it
prints came from the supervisor (``progress_source``); right after, the summary file is
read as status read it before (the baseline). A shown step's *lag* is how long it had been
over when it was printed: 0 while the job was still in it (tests/helpers/lag.py). Needs the
devcluster (HPCTRAIN_DEVCLUSTER_INSTANCE picks the instance) and an idle queue.

At scale, without Slurm: the supervisor's real board holding --ranks ranks' records (sent
as the nodes' relays send them, 8 ranks a datagram) behind its real live server; the time
of one authenticated ask and answer over UDP (median and worst of 50), against a board of
8 ranks in the same run. What a shown step's age adds up to at any size: the heartbeat
(rank 0's node sends every 2 s), the relay's tick (0.5 s) and this.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from helpers.lag import Poll, figures  # noqa: E402

from hpctrain import protocol  # noqa: E402
from hpctrain.devcluster.cluster import DevCluster  # noqa: E402
from hpctrain.protocol import channel, live as live_query  # noqa: E402
from hpctrain.protocol.progress import Progress  # noqa: E402
from hpctrain.spec.model import JobSpec  # noqa: E402
from hpctrain.supervisor.board import Board  # noqa: E402
from hpctrain.supervisor.live import LiveServer  # noqa: E402
from hpctrain.supervisor.statedir import StateDir  # noqa: E402

PER_NODE, ASKS = 8, 50

SHARED = Path("/var/lib/hpctrain/devcluster/shared")


def hpctrain(*argv: str, cwd: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "hpctrain", *argv, "--json"], cwd=cwd,
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def measure(steps: int, step_s: float) -> dict:
    root = SHARED / f"lag-bench-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    log = root / "events.jsonl"
    spec = JobSpec.from_dict({
        "name": "lag-bench", "partition": "debug", "nodes": 2, "gpus_per_node": 2,
        "time": "00:15:00", "output": f"{root}/job-%j.out", "workdir": str(root),
        "run": {"launcher": "srun", "env": {"OMP_NUM_THREADS": "1"}, "command": [
            sys.executable, str(ROOT / "tests" / "programs" / "runtime_steps.py"),
            "--steps", str(steps), "--save-every", "20", "--step-sleep", str(step_s),
            "--events", str(log)]},
        "checkpoint": {"dir": f"{root}/ckpt"}})
    (root / "job.toml").write_text(spec.to_toml())
    job = hpctrain("submit", str(root / "job.toml"), cwd=root)["job_id"]
    state = protocol.state_dir(root / "ckpt", job)
    live: list[Poll] = []
    summary: list[Poll] = []
    seconds: list[float] = []
    while True:
        start = time.monotonic()
        row = hpctrain("status", job, cwd=root)["jobs"][0]
        seconds.append(time.monotonic() - start)
        if row["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        at = time.time()
        if row["state"] == "RUNNING" and row["progress_source"] == "supervisor":
            live.append(Poll(at, row["progress_step"], "supervisor"))
            old = Progress.parse(protocol.read_record(state / protocol.SUMMARY))
            if old is not None and old.step.isdigit():
                summary.append(Poll(at, int(old.step), "summary"))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - start)))
    done_at = {e["step"]: e["time"] for e in map(json.loads, log.read_text().splitlines())
               if e["event"] == "step"}
    end = done_at.get(steps - 1, time.time())
    result = {"job": job, "state": row["state"], "final_step_shown": row["progress_step"],
              "live": figures([p for p in live if p.at <= end], done_at),
              "summary": figures([p for p in summary if p.at <= end], done_at),
              "status_call_s": sorted(seconds)[len(seconds) // 2]}
    result["median_ratio"] = result["summary"]["median_s"] / max(result["live"]["median_s"],
                                                                 1e-3)
    return result


def answer_time(ranks: int) -> dict:
    """Median and worst seconds of one ask and answer, the board holding ``ranks`` ranks."""
    import socket
    import statistics
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        state, _ = StateDir.claim(tmp, "1", 0, "bench", "")
        board = Board()
        server = LiveServer(state, "1", 0, board, "localhost")
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        now = time.time()
        rows = [{"run_id": state.run_id, "restart_count": "0", "attempt": "0",
                 "rank": str(r), "node": f"n{r // PER_NODE:04d}", "step": "1234",
                 "boundaries": "1235", "phase": "training", "changed_at": f"{now:.3f}",
                 "beat_at": f"{now:.3f}"} for r in range(ranks)]
        for i in range(0, ranks, PER_NODE):
            for gram in channel.records_messages(board.token, rows[i]["node"],
                                                 rows[i:i + PER_NODE], relay=True):
                sender.sendto(gram, ("127.0.0.1", board.port))
            if i % (256 * PER_NODE) == 0:
                board.drain()            # in bursts the kernel's buffer holds
        board.drain()
        assert len(board.records()) == ranks, len(board.records())
        times = []
        for _ in range(ASKS):
            t0 = time.perf_counter()
            answer = live_query.ask([server.address])["1"]
            times.append(time.perf_counter() - t0)
            assert answer.record["step"] == "1234"
        server.close()
        board.close()
        sender.close()
    return {"ranks": ranks, "median_ms": statistics.median(times) * 1e3,
            "worst_ms": max(times) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-s", type=float, default=0.5)
    ap.add_argument("--ranks", default="8,8192",
                    help="board sizes for the answer's cost, the first the baseline")
    ap.add_argument("--no-job", action="store_true", help="only the answer's cost")
    ap.add_argument("--json", dest="out")
    args = ap.parse_args()
    sizes = [answer_time(int(n)) for n in args.ranks.split(",")]
    base = sizes[0]
    for size in sizes:
        print(f"answer with {size['ranks']:>5} ranks on the board: median "
              f"{size['median_ms']:.2f} ms, worst {size['worst_ms']:.2f} ms "
              f"({size['median_ms'] / base['median_ms']:.2f}x the {base['ranks']}-rank board)")
    if args.no_job:
        return 0
    os.environ.update(DevCluster().client_env())
    result = measure(args.steps, args.step_s)
    result["answer"] = sizes
    live, old = result["live"], result["summary"]
    print(f"job {result['job']} ({result['state']}, last line shows step "
          f"{result['final_step_shown']}): {live['polls']} polls of `hpctrain status` "
          f"(median {result['status_call_s']:.2f} s each)")
    print(f"  live query:   median {live['median_s']:.2f} s, worst {live['worst_s']:.2f} s old")
    print(f"  summary file: median {old['median_s']:.2f} s, worst {old['worst_s']:.2f} s old "
          f"(baseline, the same polls; median {result['median_ratio']:.1f}x the live one)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
