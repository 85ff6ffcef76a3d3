"""benchmarks/inprocess_bench.py's table (issue 59: every figure in docs regenerable): the
per-launcher table of docs/fault-recovery.md is what ``recovery_table`` prints, so its
shape, medians, ranges and ratios are checked here on made-up figures (no cluster)."""

from __future__ import annotations

import datetime
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "inprocess_bench.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("inprocess_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def job(crash: float, hang: float, detected: float, startup: float) -> dict[str, float]:
    return {"crash": crash, "hang": hang, "hang after detection": detected,
            "start-up": startup}


def test_table_rows_medians_ranges_ratios(bench: ModuleType) -> None:
    figures = {
        "srun": {"cold": [job(10.0, 16.0, 6.0, 5.0), job(11.0, 17.0, 7.0, 6.0),
                          job(12.0, 15.0, 5.0, 7.0)],
                 "inprocess": [job(0.5, 12.0, 2.0, 5.5), job(0.4, 13.0, 3.0, 6.5),
                               job(0.6, 14.0, 2.5, 6.0)]},
        "torchrun": {"cold": [job(20.0, 25.0, 15.0, 9.0)],
                     "inprocess": [job(0.0, 12.0, 2.0, 9.0)]},
    }
    lines = bench.recovery_table(figures).splitlines()
    assert lines[0].startswith("| launcher | from the last step before")
    assert lines[1] == "|---|---|---|---|---|"
    assert len(lines) == 2 + 2 * 4                 # three recoveries and the start, each
    assert all(line.count("|") == 6 for line in lines)
    srun = [line for line in lines if line.startswith("| srun |")]
    assert srun[0] == ("| srun | a crash on one rank | 0.5 s (0.4-0.6) (goal <= 3 s) | "
                       "11.0 s (10.0-12.0) | 22.0x |")
    assert "`hang_timeout_s = 10` alone" in srun[1]
    assert srun[1].endswith("| 13.0 s (12.0-14.0) | 16.0 s (15.0-17.0) | 1.2x |")
    assert srun[2].endswith("| 2.5 s (2.0-3.0) (goal <= 3 s) | 6.0 s (5.0-7.0) | 2.4x |")
    # the first start pools both kinds' jobs (all of them start cold)
    assert "6 jobs" in srun[3] and srun[3].endswith("| | 6.0 s (5.0-7.0) | |")
    torchrun = [line for line in lines if line.startswith("| torchrun |")]
    # one job: no range; an in-process time of 0 gives no ratio rather than a division
    assert torchrun[0].endswith("| 0.0 s (goal <= 3 s) | 20.0 s | n/a |")


def test_caption_names_command_date_machine_and_n(bench: ModuleType) -> None:
    text = bench.caption(bench.Where(), ["--launchers", "srun,torchrun", "--repeat", "3"], 3,
                         datetime.date(2026, 11, 29), "2.13.0", 2)
    assert text.startswith("`python benchmarks/inprocess_bench.py --launchers srun,torchrun "
                           "--repeat 3`, 2026-11-29, 2-core machine, torch 2.13.0:")
    assert "medians of 3 job(s) per cell" in text
    assert bench.caption(bench.Where(), [], 3, datetime.date(2026, 11, 29), "2.13.0",
                         None).startswith("`python benchmarks/inprocess_bench.py`, 2026-11-29, "
                                          "?-core machine")
