"""How long `hpctrain plan` takes, as a ratio to starting Python at all (`python -c pass`).

Run: .venv/bin/python benchmarks/plan_bench.py [--repeat N]

Both are measured in the same run, as whole processes (what a user on a login node
waits for), and the median of N runs is reported. A second table times the planner
alone (in-process, no interpreter start-up) for the bigger searches.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HPCTRAIN = str(Path(sys.executable).parent / "hpctrain")
CASES = {
    "70B inference, 8x80GB": ["--params", "70B", "--mode", "inference",
                              "--gpus-per-node", "8", "--gpu-mem", "80GB"],
    "175B train, 8x80GB, <=64 nodes": ["--params", "175B", "--gpus-per-node", "8",
                                       "--gpu-mem", "80GB", "--tokens", "300B"],
    "70B train on debug (no fit + advice)": ["--params", "70B", "--partition", "debug"],
}


def wall(argv: list[str], repeat: int) -> float:
    """Median wall time of running ``argv`` as a process (exit code ignored: errors count)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def in_process(args: list[str], repeat: int) -> float:
    from hpctrain.cli import main
    import contextlib
    import io
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main(["plan", *args])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    repeat = parser.parse_args().repeat
    base = wall([sys.executable, "-c", "pass"], repeat)
    print(f"baseline `python -c pass`: {base * 1000:.0f} ms (median of {repeat})")
    print(f"{'case':<40} {'process ms':>10} {'x baseline':>10} {'planner ms':>10}")
    for name, args in CASES.items():
        total = wall([HPCTRAIN, "plan", *args], repeat)
        inner = in_process(args, repeat)
        print(f"{name:<40} {total * 1000:>10.0f} {total / base:>10.1f} {inner * 1000:>10.1f}")


if __name__ == "__main__":
    main()
