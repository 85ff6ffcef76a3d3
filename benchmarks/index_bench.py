"""The job index at 100,000 entries of history, against an index holding only the entries
each lookup shows (goal: <= 1.3x), measured in the same run.

    .venv/bin/python benchmarks/index_bench.py [--entries 100000] [--repeat 31] [--runs 7]

1. The lookups the commands make, in-process (medians of ``--repeat``, the two sides taken
   in turn): the newest 20 (``status``), a job id recorded long ago and lately (``status
   JOB``, ``logs``, ``report``), an array task (``123_4``), and a 1,000-point sweep
   (``status/cancel/report SWEEP``: find, then its arrays).
2. The whole commands as processes (``hpctrain status --json`` and the others), medians of
   ``--runs``, with their peak RSS. They need no Slurm: sacct, squeue and scancel are stub
   scripts that answer nothing at once (Slurm's own time is the same on both sides and not
   the index's to save), so this is the index plus Python's start-up and imports.
3. The one-time migration: the first lookup after upgrading, on a ``jobs.jsonl`` of the
   whole history and no index.

The history is a heavy user's mix: single jobs, and every 400th submission a sweep of
1,000 points (one array of 1,000 tasks, or two of 500), each array entry carrying its
points. Prints a table and the ratios; ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpctrain import protocol  # noqa: E402
from hpctrain.jobs import index  # noqa: E402
from hpctrain.jobs.handle import expand_pattern  # noqa: E402
from hpctrain.jobs.index import JobEntry  # noqa: E402

SWEEP_EVERY = 400
POINTS = 1000


def history(n: int, root: Path) -> tuple[list[JobEntry], dict[str, str]]:
    """``n`` entries as a heavy user's submissions leave them (job folders and checkpoints
    under ``root``), and the ids to look up."""
    rng = random.Random(7)
    entries: list[JobEntry] = []
    job_id, sweeps = 4_000_000, 0
    while len(entries) < n:
        job_id += rng.randint(1, 40)                 # other users' jobs in between
        name = f"exp-{rng.choice(['gpt', 'vit', 'bert', 'moe'])}-{len(entries) % 97}"
        folder = f"{root}/hpctrain-jobs/{name}"
        common = dict(name=name, folder=folder, log=f"{folder}/logs/%x-%j.out",
                      checkpoint_dir=f"{root}/ckpt/{name}", partition="gpu",
                      submitted_at=1.7e9 + len(entries) * 60.0, spec=f"specs/{name}.toml")
        if len(entries) % SWEEP_EVERY == SWEEP_EVERY - 1:
            arrays = 2 if sweeps % 2 else 1          # two of 500 where MaxArraySize is small
            sweeps += 1
            size, first = POINTS // arrays, str(job_id)
            points = [{"optim.lr": f"{1e-4 * (1 + i % 10):.1e}", "seed": str(i // 10),
                       "model.dropout": "0.1"} for i in range(POINTS)]
            for a in range(arrays):
                entries.append(JobEntry(
                    job_id=first if a == 0 else str(job_id + a), kind="sweep", num_tasks=size,
                    sweep_id=first, sweep_offset=a * size,
                    points=points[a * size:(a + 1) * size],
                    extra={"max_parallel": 64, "array": f"0-{size - 1}%64",
                           "total_points": POINTS, "run_id": f"{rng.getrandbits(64):016x}"},
                    **common))  # type: ignore[arg-type]
            job_id += arrays
        else:
            entries.append(JobEntry(
                job_id=str(job_id), kind=rng.choice(["script", "script", "function"]),
                num_tasks=rng.choice([1, 4, 8, 16]),
                extra={"submit_dir": f"{root}/src/{name}",
                       "run_id": f"{rng.getrandbits(64):016x}",
                       "snapshot": f"{folder}/snapshot-{rng.getrandbits(32):08x}"},
                **common))  # type: ignore[arg-type]
    entries = entries[:n]
    singles = [e for e in entries if e.kind != "sweep"]
    two = [e for e in entries if e.kind == "sweep" and e.sweep_offset == POINTS // 2]
    middle = two[len(two) // 2]                      # second array of a 2-array sweep
    one = [e for e in entries if e.kind == "sweep" and e.num_tasks == POINTS]
    return entries, {"old": singles[len(singles) // 100].job_id,
                     "new": singles[-100].job_id,
                     "task": f"{one[len(one) // 2].job_id}_417",
                     "sweep": middle.sweep_id}


def write_log(cache: Path, entries: list[JobEntry]) -> None:
    """A jobs.jsonl as hpctrain has always written it (no index yet)."""
    cache.mkdir(mode=0o700, parents=True)
    with open(cache / "jobs.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(asdict(e), sort_keys=True) + "\n" for e in entries)
    os.chmod(cache / "jobs.jsonl", 0o600)


def use(cache: Path) -> None:
    os.environ["HPCTRAIN_CACHE_DIR"] = str(cache)


def shown(entries: list[JobEntry], ids: dict[str, str]) -> dict[str, list[JobEntry]]:
    """Per lookup, the entries it shows: what the small index holds."""
    def of(jid: str) -> list[JobEntry]:   # what index.find and sweep_members can answer
        return [e for e in entries if e.job_id == jid.split("_")[0] or e.sweep_id == jid]
    return {"newest 20": entries[-20:], "job (old)": of(ids["old"]), "job (new)": of(ids["new"]),
            "array task": of(ids["task"]), "1,000-point sweep": of(ids["sweep"])}


def lookups(ids: dict[str, str]) -> dict[str, Callable[[], object]]:
    """What the commands ask the index (commands/status.py via jobs/listing.py, cancel,
    report, logs via Job.attach)."""
    def target(jid: str) -> object:
        rec = index.find(jid)
        if rec is not None and rec.kind == "sweep" and rec.sweep_id == jid:
            return index.sweep_members(jid)
        return rec
    return {"newest 20": lambda: index.load(20), "job (old)": lambda: target(ids["old"]),
            "job (new)": lambda: target(ids["new"]), "array task": lambda: target(ids["task"]),
            "1,000-point sweep": lambda: target(ids["sweep"])}


def in_process(full: Path, small: dict[str, Path], calls: dict[str, Callable[[], object]],
               repeat: int) -> dict[str, tuple[float, float]]:
    """Median seconds of each lookup over the full and the small index, taken in turn."""
    out = {}
    for name, call in calls.items():
        for cache in (full, small[name]):            # warm: both indexes exist and are read
            use(cache)
            call()
        times: dict[str, list[float]] = {"full": [], "small": []}
        for _ in range(repeat):
            for side, cache in (("full", full), ("small", small[name])):
                use(cache)
                t = time.perf_counter()
                call()
                times[side].append(time.perf_counter() - t)
        out[name] = (statistics.median(times["full"]), statistics.median(times["small"]))
    return out


# Runs one command and prints its wall time, peak RSS and exit code. A child of this big
# process would not do: Linux counts the memory it had before exec in the child's peak.
TIMER = """import json, os, subprocess, sys, time
t = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
_, status, usage = os.wait4(p.pid, 0)
print(json.dumps([time.perf_counter() - t, usage.ru_maxrss, os.waitstatus_to_exitcode(status)]))
"""


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (KiB) and exit code of one process."""
    out = subprocess.run([sys.executable, "-c", TIMER, *argv], env=env, capture_output=True,
                         text=True, check=True).stdout
    elapsed, rss, code = json.loads(out)
    return elapsed, rss, code


def processes(full: Path, small: dict[str, Path], commands: dict[str, tuple[str, list[str]]],
              stubs: Path, runs: int) -> dict[str, dict[str, float]]:
    """Median wall time and peak RSS of each command over both indexes, taken in turn."""
    hp = [sys.executable, "-m", "hpctrain"]
    base = {**os.environ, "PATH": f"{stubs}:{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(ROOT)}
    out = {}
    for name, (case, args) in commands.items():
        envs = {"full": {**base, "HPCTRAIN_CACHE_DIR": str(full)},
                "small": {**base, "HPCTRAIN_CACHE_DIR": str(small[case])}}
        got: dict[str, list[tuple[float, int, int]]] = {"full": [], "small": []}
        for side, env in envs.items():
            run_once([*hp, *args], env)              # warm: .pyc files
        for _ in range(runs):
            for side, env in envs.items():
                got[side].append(run_once([*hp, *args], env))
        codes = {side: {r[2] for r in rs} for side, rs in got.items()}
        out[name] = {f"{side}_{what}": statistics.median(r[i] for r in rs)
                     for side, rs in got.items() for i, what in ((0, "s"), (1, "rss_kib"))}
        out[name]["same_exit"] = float(codes["full"] == codes["small"])
        out[name]["failed"] = float(codes["full"] != {0})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=31, help="in-process repeats (median)")
    ap.add_argument("--runs", type=int, default=9, help="process runs per command (median)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="index-bench-"))
    try:
        entries, ids = history(args.entries, work)
        old = next(e for e in entries if e.job_id == ids["old"])
        # `report OLD` finds its state directory (empty: no runs); `logs OLD` its log
        protocol.state_dir(old.checkpoint_dir, old.job_id).mkdir(parents=True)
        Path(expand_pattern(old.log, old.job_id, name=old.name)).parent.mkdir(parents=True)
        Path(expand_pattern(old.log, old.job_id, name=old.name)).write_text("step 1\n")
        full = work / "full"
        write_log(full, entries)
        log_mb = (full / "jobs.jsonl").stat().st_size / 1e6

        # 3. migration: the first lookup after the upgrade indexes the whole log
        use(full)
        migrations = []
        for _ in range(3):
            shutil.rmtree(full / "jobs.idx", ignore_errors=True)
            t = time.perf_counter()
            assert index.find(ids["new"]) is not None
            migrations.append(time.perf_counter() - t)
        idx_mb = sum(p.stat().st_size for p in (full / "jobs.idx").iterdir()) / 1e6

        small = {}
        for i, (name, subset) in enumerate(shown(entries, ids).items()):
            small[name] = work / f"small-{i}"
            use(small[name])
            index.append(subset)                     # written as hpctrain writes, indexed

        calls = lookups(ids)
        lookup_times = in_process(full, small, calls, args.repeat)

        stubs = work / "stub-bin"
        stubs.mkdir()
        for binary in ("sacct", "squeue", "scancel"):
            (stubs / binary).write_text("#!/bin/sh\nexit 0\n")
            (stubs / binary).chmod(0o755)
        commands = {
            "status --json": ("newest 20", ["status", "--json"]),
            "status OLD --json": ("job (old)", ["status", ids["old"], "--json"]),
            "status NEW --json": ("job (new)", ["status", ids["new"], "--json"]),
            "status TASK --json": ("array task", ["status", ids["task"], "--json"]),
            "status SWEEP --json": ("1,000-point sweep", ["status", ids["sweep"], "--json"]),
            "cancel SWEEP": ("1,000-point sweep", ["cancel", ids["sweep"]]),
            "report OLD": ("job (old)", ["report", ids["old"]]),
            "logs OLD": ("job (old)", ["logs", ids["old"]]),
        }
        command_times = processes(full, small, commands, stubs, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "entries": args.entries, "log_mb": round(log_mb, 1), "index_mb": round(idx_mb, 2),
        "migration_s": statistics.median(migrations),
        "lookups": {k: {"full_ms": f * 1e3, "small_ms": s * 1e3, "ratio": f / s}
                    for k, (f, s) in lookup_times.items()},
        "commands": {k: {**v, "ratio": v["full_s"] / v["small_s"],
                         "rss_ratio": v["full_rss_kib"] / v["small_rss_kib"]}
                     for k, v in command_times.items()},
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"history: {args.entries} entries, jobs.jsonl {log_mb:.1f} MB, jobs.idx "
          f"{idx_mb:.2f} MB; one-time migration (first lookup, no index): "
          f"{result['migration_s']:.2f} s (median of 3)")
    print(f"\nlookups in-process (median of {args.repeat}; the index of only what is shown "
          "= 1x)")
    print(f"{'lookup':<20} {'history ms':>10} {'shown ms':>9} {'ratio':>7}")
    for name, r in result["lookups"].items():
        print(f"{name:<20} {r['full_ms']:>10.3f} {r['small_ms']:>9.3f} {r['ratio']:>6.2f}x")
    print(f"\ncommands as processes, stub Slurm (median of {args.runs})")
    print(f"{'command':<22} {'history ms':>10} {'shown ms':>9} {'ratio':>7} {'RSS MB':>7} "
          f"{'RSS ratio':>9}")
    for name, r in result["commands"].items():
        flag = "" if r["same_exit"] else "  (exit codes differ!)"
        flag += "" if not r["failed"] else "  (exited non-zero)"
        print(f"{name:<22} {r['full_s'] * 1e3:>10.0f} {r['small_s'] * 1e3:>9.0f} "
              f"{r['ratio']:>6.2f}x {r['full_rss_kib'] / 1024:>7.0f} {r['rss_ratio']:>8.2f}x"
              f"{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
