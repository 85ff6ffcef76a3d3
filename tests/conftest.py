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
