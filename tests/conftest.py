"""Shared test set-up for tests/unit (no cluster) and tests/cluster (the real SLURM
devcluster; its fixtures are in tests/cluster/conftest.py).

House rule: a test whose prerequisite (the SLURM devcluster, torch, deepspeed) is
missing skips on a developer's machine but FAILS when CI=true, so CI can never go
green by skipping. Use :func:`helpers.prereq.require` for any such check, never
``pytest.skip``.

This file's directory, tests/, is on sys.path (pytest's default "prepend" import mode,
no __init__.py here), so every test imports ``helpers.<name>`` and ``programs.<name>``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from helpers.prereq import require


def pytest_runtest_setup(item: pytest.Item) -> None:
    for module in ("torch", "deepspeed", "lightning", "transformers"):
        if item.get_closest_marker(module) is not None:
            require(importlib.util.find_spec(module) is not None, f"python package {module!r}")


# ---- the longest files first (issue 44). ./dev.sh test hands whole files to its parallel
# workers in collection order (--dist loadfile --no-loadscope-reorder): the files that take
# longest start first and the short ones fill in at the end, so no worker is left running
# a 10-minute file alone while the others are done. The seconds are a full run's
# (tests/durations.json; `HPCTRAIN_TEST_TIMES_OUT=/tmp/t.json ./dev.sh test` writes a run's,
# to copy there); a file not listed counts as a typical one of its folder.
DURATIONS = Path(__file__).with_name("durations.json")
TYPICAL_S = {"tests/cluster": 60.0, "tests/unit": 5.0}


def file_seconds() -> dict[str, float]:
    """The recorded seconds of each test file; {} when the record is missing or unreadable
    (the order is then the collection's: slower, never wrong)."""
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = file_seconds()

    def weight(item: pytest.Item) -> float:
        path = item.nodeid.split("::", 1)[0]
        return seconds.get(path, TYPICAL_S.get(path.rsplit("/", 1)[0], 5.0))

    items.sort(key=lambda item: -weight(item))   # stable: a file's tests keep their order


# ---- durations by folder and file, at the end of every run (issue 44: a test that gets
# twice as slow is noticed; CI also prints the slowest tests with --durations=25)
_SPENT: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _SPENT[path] = _SPENT.get(path, 0.0) + report.duration   # setup, call and teardown


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    if not _SPENT:
        return
    folders: dict[str, float] = {}
    for path, spent in _SPENT.items():
        folder = path.rsplit("/", 1)[0]
        folders[folder] = folders.get(folder, 0.0) + spent
    write = terminalreporter.write_line
    terminalreporter.section("time by folder and by file (setup + call + teardown)")
    for folder, spent in sorted(folders.items(), key=lambda kv: -kv[1]):
        write(f"{spent:8.1f}s  {folder}/")
    for path, spent in sorted(_SPENT.items(), key=lambda kv: -kv[1])[:15]:
        write(f"{spent:8.1f}s  {path}")
    # a file at least twice as slow as its recorded seconds (those of 20 s or more: below,
    # machine noise decides) is named, so a regression is noticed where it happened
    recorded = file_seconds()
    for path, spent in sorted(_SPENT.items()):
        was = recorded.get(path, 0.0)
        if was >= 20 and spent >= 2 * was:
            write(f"SLOWER: {path} took {spent:.0f} s, {spent / was:.1f}x its recorded {was:.0f} s "
                  f"(tests/durations.json)")
    out = os.environ.get("HPCTRAIN_TEST_TIMES_OUT")
    if out:   # every file's seconds, for the order of the next runs (DURATIONS); added
        # to what the file holds (./dev.sh test runs its `alone` tests as a second session)
        try:
            known = json.loads(Path(out).read_text())
        except (OSError, ValueError):
            known = {}
        known.update({p: round(s) for p, s in _SPENT.items()})
        ranked = dict(sorted(known.items(), key=lambda kv: -kv[1]))
        Path(out).write_text(json.dumps(ranked, indent=1) + "\n")
        write(f"every file's seconds written to {out}")
