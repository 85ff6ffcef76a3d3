"""Shared test fixtures.

House rule: a test whose prerequisite (the SLURM devcluster, torch, deepspeed) is
missing skips on a developer's machine but FAILS when CI=true, so CI can never go
green by skipping. Use :func:`require` for any such check, never ``pytest.skip``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(ok: bool, what: str) -> None:
    """Skip locally, fail in CI, when a prerequisite ``what`` is missing."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"CI=true and a prerequisite is missing: {what}", pytrace=False)
    pytest.skip(f"prerequisite missing: {what} (with CI=true this fails instead)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for module in ("torch", "deepspeed"):
        if item.get_closest_marker(module) is not None:
            require(importlib.util.find_spec(module) is not None, f"python package {module!r}")


def _queued() -> set[str]:
    from hpctrain.slurm import client

    return set(client.run(["squeue", "-h", "-o", "%A"], check=False).stdout.split())


@pytest.fixture(autouse=True)
def _cluster_left_usable(request: pytest.FixtureRequest):
    """After each devcluster test, cancel the jobs it left queued and resume any node it
    left DOWN or DRAIN: a failed test must not make the next one wait for a node forever.
    Jobs queued before the test (somebody's demo) are left alone."""
    if "cluster" not in request.fixturenames:
        yield
        return
    dev = request.getfixturevalue("cluster")
    before = _queued()
    yield
    from hpctrain.slurm import client

    left = sorted(_queued() - before)
    if left:
        client.run(["scancel", *left], check=False)
        deadline = time.monotonic() + 60
        while still := _queued() & set(left):
            if time.monotonic() > deadline:
                pytest.fail(f"jobs {sorted(still)} left by this test are still queued 60 s "
                            "after scancel")
            time.sleep(0.5)
    dev.make_nodes_usable()


@pytest.fixture(scope="session")
def cluster():
    """The real local SLURM cluster (``hpctrain devcluster``), brought up once per session.

    Sets SLURM_CONF for this process and its children so plain ``sbatch`` etc. find it.
    Never brought down here: later sessions reuse it (``up`` is idempotent).
    """
    require(sys.platform.startswith("linux"), "Linux")
    require(os.geteuid() == 0, "root (the devcluster starts slurmctld/slurmd as root)")
    from hpctrain.devcluster.cluster import DevCluster, Shape

    dev = DevCluster()
    dev.up(Shape())
    os.environ.update(dev.client_env())
    return dev
