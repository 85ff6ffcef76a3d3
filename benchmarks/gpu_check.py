"""The GPU check: what only a real GPU can show of hpctrain's in-job side. Never in CI; run it
whenever a machine with CUDA GPUs is at hand (it needs no Slurm: a stand-in answers the
supervisor's side of the restart dialog, tests/helpers/standin_supervisor.py):

    python benchmarks/gpu_check.py [--size 2G] [--repeat 3] [--out gpu.json]

1. **devices**: one rank per GPU (as srun starts them), each on its own CUDA device, NCCL.
2. **in-process restarts on NCCL** (``hpctrain.runtime.run``, tests/programs/plain_dp_loop.py
   on the GPUs): an undisturbed run, then the same run through a crash (restarted in its
   processes: the NCCL group aborted and rebuilt), an out-of-memory error (not sticky:
   in place too) and a real sticky CUDA error (a device-side assert: the attempt ends, the
   stand-in says stop, the processes leave and are started anew, as the supervisor
   restarts a step in new processes, from the durable checkpoint). Each restart's time from
   the last step before the fault to the first step after; the final parameters compared
   bitwise with the undisturbed run's.
3. **checkpoints of CUDA tensors**: ``CheckpointManager`` against ``torch.distributed.
   checkpoint`` (one process): durable save, cold verified load into CUDA tensors, and the
   training loop's stall of an async save against one device-to-host copy into pinned
   memory (what every async saver must pay), interleaved, medians and ratios of one run.

Prints a report and writes every figure to ``--out`` (JSON), the device named.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))    # the stand-in supervisor, the rank launcher

import torch  # noqa: E402

from hpctrain import protocol as p  # noqa: E402
from helpers.standin_supervisor import StandIn  # noqa: E402
from helpers.torchrun import bitwise_equal, env_for, start_ranks, wait_ranks  # noqa: E402

LOOP = ROOT / "tests" / "programs" / "plain_dp_loop.py"
RUN = {"HPCTRAIN_RUN_ID": "r1", "HPCTRAIN_RESTART_COUNT": "0", "SLURM_RESTART_COUNT": "0"}
STEPS, SAVE_EVERY = 30, 8
# attempt 0 crashes just after the step-8 save; attempt 1 runs out of device memory; attempt
# 2 makes a sticky CUDA error just after the step-16 save (all on rank 0)
FAULTS = ("crash@10:0:0", "oom@13:0:1", "device-error@20:0:2")


def device_name() -> str:
    props = torch.cuda.get_device_properties(0)
    return (f"{torch.cuda.device_count()} x {props.name} ({props.total_memory / 2**30:.0f} "
            f"GiB), torch {torch.__version__}, CUDA {torch.version.cuda}")


# ---- 1 and 2: ranks on the GPUs, restarted in their processes ------------------------------
def loop_run(work: Path, world: int, faults: tuple[str, ...], attempt: int = 0,
             timeout: float = 150) -> dict[str, Any]:
    """One run of the plain DP loop on ``world`` ranks with the stand-in supervisor."""
    state = work / "state"
    state.mkdir(parents=True, exist_ok=True)
    (work / "ckpt").mkdir(exist_ok=True)
    env = env_for(HPCTRAIN_STATE_DIR=str(state), HPCTRAIN_EXIT_FILE=str(state / p.EXIT),
                  HPCTRAIN_HEARTBEAT_S="0.2", HPCTRAIN_COLLECTIVE_TIMEOUT_S="60",
                  HPCTRAIN_STEP_ATTEMPT=str(attempt), **RUN)
    stand_in = StandIn(state, world)
    args = ["--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--step-sleep", "0.02",
            "--ckpt-dir", str(work / "ckpt"), "--events", str(work / "events.jsonl"),
            "--final", str(work / "final")]
    procs = start_ranks(LOOP, world, env, work / "out.txt",
                        (*args, *(w for f in faults for w in ("--fault", f))))
    try:
        codes = wait_ranks(procs, timeout=timeout)
    finally:
        stand_in.done.set()
    return {"codes": codes, "actions": stand_in.actions,
            "words": [w for _, _, w in stand_in.answered],
            "exit": p.read_record(state / p.EXIT)}


def events(work: Path) -> list[dict]:
    path = work / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def restart_times(found: list[dict]) -> list[float]:
    """Per attempt boundary: from the last step of one attempt to the first of the next."""
    by_attempt: dict[int, list[float]] = {}
    for e in found:
        if e["event"] == "step":
            by_attempt.setdefault(e["attempt"], []).append(e["time"])
    attempts = sorted(by_attempt)
    return [round(min(by_attempt[b]) - max(by_attempt[a]), 2)
            for a, b in zip(attempts, attempts[1:])]


def final_params(work: Path, world: int) -> list[dict]:
    return [torch.load(work / "final" / f"rank-{r}.pt") for r in range(world)]


def check_restarts(base: Path) -> dict[str, Any]:
    world = torch.cuda.device_count()
    clean, faulty = base / "clean", base / "faulty"
    first = loop_run(clean, world, ())
    starts = [e for e in events(clean) if e["event"] == "start"]
    out: dict[str, Any] = {"world": world, "clean": first,
                           "devices": [s.get("device") for s in starts],
                           "backend": starts[0].get("backend") if starts else None}
    # attempts 0-2 in the first processes; the sticky error ends them (stop)
    faulted = loop_run(faulty, world, FAULTS)
    in_place = events(faulty)
    # the step restarted in new processes, as the supervisor does after a stop: attempt 3
    again = loop_run(faulty, world, FAULTS, attempt=3)
    found = events(faulty)
    starts = [e for e in found if e["event"] == "start"]
    out.update(
        faulted=faulted, restarted=again,
        starts=[(s["attempt"], s["step"], s["pid"]) for s in starts],
        restart_s=restart_times(found),
        in_place_pids=len({s["pid"] for s in starts if s["attempt"] < 3}),
        done=any(e["event"] == "done" for e in found),
        bitwise_equal=(first["codes"] == again["codes"] == [0] * world
                       and bitwise_equal(final_params(clean, world),
                                         final_params(faulty, world))),
        first_process_steps=max((e["step"] for e in in_place if e["event"] == "step"),
                                default=None))
    return out


# ---- 3: checkpoints of CUDA tensors --------------------------------------------------------
def cuda_state(nbytes: int) -> dict:
    """Model + Adam moments of about ``nbytes`` of float32 on the GPU: a few large matrices
    and many small vectors, as a transformer's."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    cols, left = [], nbytes // 3 // 4 // 1024
    while left > 0:
        cols.append(min(left, 8192))
        left -= cols[-1]
    cols += [1] * 64

    def t(n: int) -> torch.Tensor:
        return torch.randn(1024, n, generator=gen, device="cuda")
    return {"model": {f"l{i}.w": t(n) for i, n in enumerate(cols)},
            "optim": {f"l{i}": {"m": t(n), "v": t(n).abs()} for i, n in enumerate(cols)},
            "step": 10}


def leaves(state: dict) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in state.values():
        out += leaves(v) if isinstance(v, dict) else [v] if isinstance(v, torch.Tensor) else []
    return out


def like(state: dict) -> dict:
    return {k: like(v) if isinstance(v, dict) else torch.zeros_like(v)
            if isinstance(v, torch.Tensor) else 0 for k, v in state.items()}


def drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def check_checkpoints(base: Path, nbytes: int, repeat: int) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from hpctrain.checkpoint import CheckpointManager

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")

    state = cuda_state(nbytes)
    total = sum(t.nbytes for t in leaves(state))
    for name in ("hp", "hp-async"):
        (base / name).mkdir(parents=True, exist_ok=True)
    hp = CheckpointManager(base / "hp", keep_last=1)
    hp_async = CheckpointManager(base / "hp-async", keep_last=1, async_save=True)
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in leaves(state)]
    step = [0]
    fig: dict[str, list[float]] = {}
    cold = True

    def hp_save() -> float:
        step[0] += 1
        os.sync()       # the last save's deletions on disk: not this save's to pay
        return timed(lambda: hp.save(step[0], state))

    def dcp_save() -> float:
        shutil.rmtree(base / "dcp", ignore_errors=True)
        os.sync()
        return timed(lambda: dcp.save(state, checkpoint_id=str(base / "dcp")))

    def hp_stall() -> float:
        step[0] += 1
        t = timed(lambda: hp_async.save(step[0], state))
        hp_async.wait()
        return t

    def dcp_stall() -> float:
        shutil.rmtree(base / "dcp-async", ignore_errors=True)
        t0 = time.perf_counter()
        fut = dcp.async_save(state, checkpoint_id=str(base / "dcp-async"))
        t = time.perf_counter() - t0
        fut.result()
        return t

    def copy_stall() -> float:
        return timed(lambda: [d.copy_(s, non_blocking=True)
                              for d, s in zip(pinned, leaves(state))])

    def load(name: str) -> float:
        nonlocal cold
        dest = like(state)
        cold = drop_caches() and cold
        if name == "hp_load":
            t = timed(lambda: hp.load(hp.latest_step(), dest))
        else:
            t = timed(lambda: dcp.load(dest, checkpoint_id=str(base / "dcp")))
        assert all(torch.equal(a, b) for a, b in zip(leaves(dest), leaves(state))), name
        return t

    for warm in (hp_stall, dcp_stall, copy_stall):   # staging memory, first CUDA copies
        warm()
    kinds = [[("hp_save", hp_save), ("dcp_save", dcp_save)],
             [("hp_async", hp_stall), ("dcp_async", dcp_stall), ("copy", copy_stall)],
             [("hp_load", lambda: load("hp_load")), ("dcp_load", lambda: load("dcp_load"))]]
    for rep in range(repeat):
        for kind in kinds:              # who goes first rotates from one repetition to the next
            k = rep % len(kind)
            for name, fn in kind[k:] + kind[:k]:
                fig.setdefault(name, []).append(fn())
    hp.close()
    hp_async.close()
    med = {k: statistics.median(v) for k, v in fig.items()}
    return {"bytes": total, "tensors": len(leaves(state)), "repeat": repeat,
            "cold_loads": cold, "median_s": med, "all_s": fig,
            "ratios": {"save_hp_vs_dcp": med["hp_save"] / med["dcp_save"],
                       "load_hp_vs_dcp": med["hp_load"] / med["dcp_load"],
                       "async_stall_hp_vs_dcp": med["hp_async"] / med["dcp_async"],
                       "async_stall_hp_vs_copy": med["hp_async"] / med["copy"]},
            "gb_s": {k: total / v / 1e9 for k, v in med.items()}}


# ---- the report -----------------------------------------------------------------------------
def report(result: dict[str, Any]) -> None:
    print(f"device: {result['device']}")
    r = result.get("restarts")
    if r:
        print(f"ranks: {r['world']}, backend {r['backend']}, devices {r['devices']}")
        print(f"faulted run: stand-in said {r['faulted']['actions']} (words "
              f"{r['faulted']['words']}), exit codes {r['faulted']['codes']}, exit record "
              f"error: {r['faulted']['exit'].get('error', '')[:100]!r}")
        print(f"starts (attempt, step, pid): {r['starts']}")
        print(f"restart times, last step -> first step after (s): {r['restart_s']} "
              "(crash in place, OOM in place, sticky error -> new processes)")
        print(f"final parameters bitwise equal to the undisturbed run: {r['bitwise_equal']}")
        rounds = result.get("rounds", [])
        ok = sum(x["bitwise_equal"] and x["faulted"]["actions"] == ["go", "go", "stop"]
                 and x["in_place_pids"] == 1 for x in rounds)
        print(f"rounds as expected (go, go, stop; one process; bitwise): {ok} of {len(rounds)}; "
              f"restart times per round: {[x['restart_s'] for x in rounds]}")
    c = result.get("checkpoints")
    if c:
        m, q = c["median_s"], c["ratios"]
        print(f"checkpoints: {c['bytes'] / 2**30:.2f} GiB of CUDA tensors ({c['tensors']}), "
              f"median of {c['repeat']}, loads cold: {c['cold_loads']}")
        for k in ("hp_save", "dcp_save", "hp_load", "dcp_load", "hp_async", "dcp_async",
                  "copy"):
            print(f"  {k:10s} {m[k]:7.3f} s  {c['gb_s'][k]:6.2f} GB/s")
        print("  ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in q.items()))


def save(result: dict[str, Any], out: str | None) -> None:
    if out:
        Path(out).write_text(json.dumps(result, indent=1, default=str))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="2G", help="bytes of CUDA tensors to checkpoint")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of each checkpoint figure")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of the restart part (its timing-dependent cases)")
    ap.add_argument("--parts", default="restarts,checkpoints")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here: run it on a GPU machine", file=sys.stderr)
        return 2
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size = int(float(args.size[:-1]) * units[args.size[-1].upper()]) \
        if args.size[-1].upper() in units else int(args.size)
    base = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=args.dir))
    result: dict[str, Any] = {"device": device_name()}
    try:
        parts = args.parts.split(",")
        for n in range(args.rounds if "restarts" in parts else 0):
            r = check_restarts(base / f"restarts-{n}")
            result.setdefault("rounds", []).append(r)
            result["restarts"] = r          # the report shows the last; --out has all
            save(result, args.out)
        if "checkpoints" in parts:
            result["checkpoints"] = check_checkpoints(base / "ckpt", size, args.repeat)
    finally:
        save(result, args.out)
        report(result)
        for log in sorted(base.glob("restarts-*/faulty/out.txt"))[-1:]:
            print(f"---- {log} (last 40 lines)")
            print("\n".join(log.read_text(errors="replace").splitlines()[-40:]))
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
