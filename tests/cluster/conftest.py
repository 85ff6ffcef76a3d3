"""Fixtures of the tests that use the real local SLURM cluster (``hpctrain devcluster``).

The house rule holds here too: without the cluster (not Linux, neither root nor a user
with passwordless sudo for the operator's steps) the ``cluster`` fixture skips locally
and FAILS when CI=true (:func:`helpers.prereq.require`).

The tests themselves run as whoever runs pytest: ``./dev.sh test`` runs it as the
ordinary user ``hpct-alice`` (docs/security.md); the operator's steps (bringing the cluster
up, a node down, slurmctld restarted) go through :mod:`helpers.admin`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from helpers import admin
from helpers.prereq import require


def _own_instance() -> None:
    """Each parallel worker (pytest-xdist's gw0, gw1, ...) has a devcluster of its own,
    instance N for worker gwN (``./dev.sh test`` brings them up first): its own daemons,
    nodes, partitions and job ids, so one worker's preemptions, lost nodes and rewritten
    slurm.conf never touch another's jobs. Set before any test runs, so every Slurm
    command of this process and its children (submissions, jobs, root's helpers) goes to
    it; a serial run (no worker) uses instance 0 (or $HPCTRAIN_DEVCLUSTER_INSTANCE)."""
    from hpctrain.devcluster.cluster import INSTANCE_ENV, DevCluster

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        os.environ[INSTANCE_ENV] = worker[2:]
    os.environ.update(DevCluster().client_env())


_own_instance()


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
    """The real local SLURM cluster (``hpctrain devcluster``), brought up once per session
    (by root, through :class:`helpers.admin.Cluster`).

    Its instance is this worker's (:func:`_own_instance`, which set SLURM_CONF for this
    process and its children so plain ``sbatch`` etc. find it). Never brought down here:
    later sessions reuse it (``up`` is idempotent).
    """
    require(sys.platform.startswith("linux"), "Linux")
    admin.require_sudo()
    from hpctrain.devcluster.config import Shape

    dev = admin.Cluster()
    dev.up(Shape())
    os.environ.update(dev.client_env())
    return dev


# the strict site's own devcluster (`devcluster up --site strict`): the last instance, apart
# from the workers' (./dev.sh test brings it up before the workers start, as it does theirs)
STRICT_INSTANCE = 7


@pytest.fixture(scope="session")
def strict_cluster() -> dict[str, str]:
    """A devcluster that counts like a real site (CPUs and memory per job, DefMemPerCPU,
    steps over their memory killed, a partition `gpu` no facts file describes): the client
    environment that reaches it (SLURM_CONF), for the commands a test runs there."""
    require(sys.platform.startswith("linux"), "Linux")
    admin.require_sudo()
    from hpctrain.devcluster.cluster import DevCluster

    env = {**os.environ, **DevCluster(instance=STRICT_INSTANCE).client_env()}
    try:
        ready = os.path.isfile(env["SLURM_CONF"]) and subprocess.run(
            ["scontrol", "show", "partition", "gpu"], env=env, capture_output=True,
            timeout=15).returncode == 0
    except subprocess.TimeoutExpired:
        ready = False
    if not ready:      # `up` is idempotent; here it starts (or reshapes) the instance
        admin.run([sys.executable, "-m", "hpctrain", "devcluster", "up", "--instance",
                   str(STRICT_INSTANCE), "--site", "strict"], timeout=600)
    return DevCluster(instance=STRICT_INSTANCE).client_env()
