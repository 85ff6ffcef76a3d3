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

import pytest

from helpers.prereq import require


def pytest_runtest_setup(item: pytest.Item) -> None:
    for module in ("torch", "deepspeed", "lightning", "transformers"):
        if item.get_closest_marker(module) is not None:
            require(importlib.util.find_spec(module) is not None, f"python package {module!r}")


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
