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
from pathlib import Path

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


# issue 56's target, 0 false alarms of the slow-node detector over every job of the suite:
# what the job logs written during the session say (a test that slows a node on purpose
# leaves helpers.jobs.SLOW_EXPECTED beside its job logs). A node named slow is an alarm
# (it is acted on); the whole job slower than its best pace is a line, never an act, and
# on this loaded machine (three workers' jobs on two cores) often true: counted, not failed
SLOW_ALARMS = ("hpctrain: slow node ",)
WHOLE_JOB = "hpctrain: the whole job runs "
LOG_SUFFIXES = (".out", ".err", ".log", ".txt")


def job_logs_since(roots: list[Path], since: float) -> list[Path]:
    """The job logs under ``roots`` written since ``since`` (folders older than it are not
    entered: the shared storage keeps earlier runs' files)."""
    found = []
    for root in roots:
        for top in (root.iterdir() if root.is_dir() else ()):
            try:
                if top.stat().st_mtime < since:
                    continue
            except OSError:
                continue
            for folder, _, files in os.walk(top):
                for name in files:
                    path = Path(folder) / name
                    try:
                        if name.endswith(LOG_SUFFIXES) and path.stat().st_mtime >= since \
                                and path.stat().st_size < 50 << 20:
                            found.append(path)
                    except OSError:
                        pass
    return found


@pytest.fixture(scope="session", autouse=True)
def _no_false_slow_alarm(tmp_path_factory: pytest.TempPathFactory):
    """After the session: no job log of this worker's jobs says a node (or the whole job)
    was slow, but those of the tests that slow one; and how many said what the detector saw
    (``hpctrain: pace:``), the proof it looked."""
    from helpers.jobs import SHARED, SLOW_EXPECTED

    start = time.time()
    yield
    alarms, looked, whole = [], 0, 0
    for path in job_logs_since([tmp_path_factory.getbasetemp(), SHARED], start):
        if any((parent / SLOW_EXPECTED).exists() for parent in path.parents):
            continue
        text = path.read_text(errors="replace")
        looked += text.count("hpctrain: pace: ")
        whole += text.count(WHOLE_JOB)
        alarms += [f"{path}: {line}" for line in text.splitlines()
                   if line.startswith(SLOW_ALARMS)]
    assert not alarms, f"the slow-node detector raised {len(alarms)} false alarm(s) " \
                       f"({looked} pace line(s) in this session's job logs, {whole} " \
                       "whole-job line(s)):\n" + "\n".join(alarms[:20])


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
