"""Checkpoint benchmark: hpctrain's CheckpointManager against DCP, torch.save and fio.

One command; every figure of a table comes from the same run, the same state and the
same disk, with the contenders interleaved in each repetition:

    .venv/bin/python benchmarks/ckpt_bench.py                       # 1 GiB, 1/2/4 ranks
    .venv/bin/python benchmarks/ckpt_bench.py --size 256M --repeat 3 --ranks 2

For each layout (``plain``: the state replicated on every rank, as DDP keeps it;
``sharded``: DTensor ``Shard(0)`` over all ranks) and rank count it runs
benchmarks/ckpt_worker.py under torchrun (gloo) and prints medians, ranges and ratios:

* durable save time against ``dcp.save``'s, and throughput against fio's O_DIRECT write
  (targets: <= 0.8x DCP, >= 0.9x fio); both also against the plainest durable write of
  the same bytes by the same ranks (the floor no saver gets far below);
* cold verified load time against ``dcp.load``'s (target <= 0.8x), page cache dropped
  before each load; every load is checked equal to what was saved;
* the async save's stall against ``dcp.async_save``'s and one in-memory copy of the state
  (targets: <= DCP, <= 1.2x the copy), and the staging memory (<= 1x the state, reused).

Needs root (to drop the page cache) and fio (``./dev.sh bench`` installs it).
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
from pathlib import Path

WORKER = Path(__file__).with_name("ckpt_worker.py")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def run_worker(world: int, layout: str, size: int, repeat: int, base: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"{layout}-{world}-", dir=base))
    out = work / "result.json"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world}", str(WORKER), f"--size={size}", f"--layout={layout}",
            f"--repeat={repeat}", f"--dir={work}", f"--out={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
    try:
        subprocess.run(argv, check=True, env=env)
        return json.loads(out.read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float]) -> str:
    return f"[{min(xs):.3f}-{max(xs):.3f}]"


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def report(r: dict) -> list[tuple[str, bool]]:
    """Print one (layout, world) table; return (target, met) pairs."""
    f, nbytes = r["figures"], r["bytes"]
    gb = 1e9
    print(f"\n{r['layout']} state, {r['world']} rank(s): {nbytes / gb:.3f} GB in "
          f"{r['tensors']} tensors ({r['local_bytes'] / gb:.3f} GB per rank); median "
          f"[range] of {len(f['hp_save'])}")
    fio_w, fio_r = med(f["fio_write"]), med(f["fio_read"])
    print(f"  fio write (O_DIRECT, 4 MiB, iodepth 8) {fio_w / gb:6.3f} GB/s  "
          f"read {fio_r / gb:.3f} GB/s   (the ceiling)")
    targets = []
    for kind, verb in (("save", "saves (durable)"), ("load", "loads (cold)")):
        print(f"  {verb}:")
        dcp_t = med(f[f"dcp_{kind}"])
        for name in (f"hp_{kind}", f"dcp_{kind}", f"torch_{kind}"):
            t = med(f[name])
            print(f"    {name:11s} {t:7.3f} s {spread(f[name]):17s} {nbytes / t / gb:6.3f} GB/s"
                  f"  {t / dcp_t:5.2f}x DCP")
        hp_t = med(f[f"hp_{kind}"])
        paired = [h / d for h, d in zip(f[f"hp_{kind}"], f[f"dcp_{kind}"])]
        print(f"    hpctrain / DCP within each repetition: median {med(paired):.2f}x "
              f"[{min(paired):.2f}-{max(paired):.2f}]")
        targets.append((f"{kind} <= 0.8x DCP", hp_t <= 0.8 * dcp_t))
        if kind == "save":
            raw_t = med(f["raw_save"])
            print(f"    raw write (write() + fsync of each rank's share) {raw_t:.3f} s "
                  f"{spread(f['raw_save'])}: hpctrain {hp_t / raw_t:.2f}x it, "
                  f"DCP {dcp_t / raw_t:.2f}x it")
            ratio = nbytes / hp_t / fio_w
            print(f"    hpctrain save throughput {ratio:.2f}x fio's write   target >= 0.90x  "
                  f"{verdict(ratio >= 0.9)}")
            targets.append(("save >= 0.9x fio write", ratio >= 0.9))
    hp_a, dcp_a, copy = med(f["hp_async"]), med(f["dcp_async"]), med(f["copy"])
    print(f"  async stall: hpctrain {hp_a:.3f} s {spread(f['hp_async'])}, dcp.async_save "
          f"{dcp_a:.3f} s {spread(f['dcp_async'])}, one copy {copy:.3f} s: "
          f"{hp_a / dcp_a:.2f}x DCP, {hp_a / copy:.2f}x the copy")
    staged = r["staging_bytes"] / r["local_bytes"]
    print(f"  staging memory {staged:.2f}x the rank's state, "
          f"{'reused' if r['staging_reused'] else 'REALLOCATED'} between saves")
    targets += [("async stall <= DCP", hp_a <= dcp_a), ("async stall <= 1.2x copy", hp_a <= 1.2 * copy),
                ("staging <= 1x, reused", staged <= 1.0 and r["staging_reused"])]
    print("  targets: " + "; ".join(f"{name} {verdict(ok)}" for name, ok in targets))
    sys.stdout.flush()
    return targets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1G", help="state size (all ranks), e.g. 256M, 1G [1G]")
    ap.add_argument("--repeat", type=int, default=5, help="interleaved repetitions [5]")
    ap.add_argument("--ranks", default="1,2,4", help="rank counts [1,2,4]")
    ap.add_argument("--layouts", default="plain,sharded", help="plain and/or sharded")
    ap.add_argument("--dir", default="/var/tmp", help="directory on the disk to test [/var/tmp]")
    args = ap.parse_args()
    if shutil.which("fio") is None:
        sys.exit("ckpt_bench: fio is not installed (apt-get install fio, or ./dev.sh bench)")
    size = parse_size(args.size)
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    missed = []
    try:
        for layout in args.layouts.split(","):
            for world in (int(w) for w in args.ranks.split(",")):
                for name, ok in report(run_worker(world, layout, size, args.repeat, base)):
                    if not ok:
                        missed.append(f"{layout}/{world}: {name}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("\nall targets met" if not missed else "\nmissed: " + "; ".join(missed))


if __name__ == "__main__":
    main()
