"""devcluster up/down/reshape on the real machine.

These tests stop and restart the whole cluster, so they restore the default shape
before they end: later tests (and the session fixture) find it up as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.devcluster import daemons
from hpctrain.devcluster.cluster import DevCluster
from hpctrain.devcluster.config import Shape
from helpers import admin
from helpers.net import listeners
from helpers.slurm import sbatch, wait_done

# alone: it brings its devcluster down and reshapes it, which rewrites /etc/hosts, whose
# node names every other worker's jobs resolve
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.alone]


def hpctrain(*args: str) -> subprocess.CompletedProcess[str]:
    """`hpctrain ARGS` as the operator (root): `devcluster up|down` is a sysadmin's tool."""
    return admin.run([sys.executable, "-m", "hpctrain", *args], check=False)


def our_processes(dev: DevCluster) -> list[str]:
    """Command lines of live processes that mention our state dir (our daemons do; another
    instance's, in /var/lib/hpctrain/devcluster-N, are not ours)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if f"{dev.paths.root}/" in cmd and "pytest" not in cmd:
                found.append(cmd)
    return found


def test_up_twice_is_a_no_op(cluster: DevCluster) -> None:
    before = {d["name"]: d["pid"] for d in cluster.status()["daemons"]}
    result = hpctrain("devcluster", "up")
    assert result.returncode == 0, result.stderr
    assert "already up" in result.stdout
    assert {d["name"]: d["pid"] for d in cluster.status()["daemons"]} == before


def test_up_resumes_a_node_an_earlier_run_left_drained(cluster: DevCluster) -> None:
    admin.run(["scontrol", "update", "nodename=n2", "state=drain", "reason=left by a test"])
    result = hpctrain("devcluster", "up")   # on failure, conftest resumes n2 after the test
    assert result.returncode == 0, result.stderr
    assert "resumed node n2 (was IDLE+DRAIN: left by a test)" in result.stdout
    assert {n["name"]: n["state"] for n in cluster.status()["nodes"]}["n2"] == "IDLE"


def test_status_json_shows_idle_nodes_gres_partitions_and_daemons(cluster: DevCluster) -> None:
    result = hpctrain("devcluster", "status", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert {n["name"] for n in info["nodes"]} == {"n1", "n2", "n3"}   # n3: the spare
    assert all(n["gres"] == "gpu:2" for n in info["nodes"])
    assert {p["name"] for p in info["partitions"]} == {"debug", "urgent", "wide"}
    assert {d["name"] for d in info["daemons"]} >= {"munged", "mariadbd", "slurmdbd",
                                                    "slurmctld", "slurmd-n1", "slurmd-n2"}
    assert all(d["alive"] for d in info["daemons"])


def test_reshape_to_three_nodes_and_back(cluster: DevCluster) -> None:
    try:
        result = hpctrain("devcluster", "up", "--nodes", "3", "--gpus-per-node", "1",
                          "--spare", "0")
        assert result.returncode == 0, result.stderr
        assert "reshaped" in result.stdout
        nodes = {n["name"]: n for n in cluster.status()["nodes"]}
        assert set(nodes) == {"n1", "n2", "n3"} and nodes["n3"]["gres"] == "gpu:1"
        job = sbatch("--nodes=3", "--ntasks-per-node=1", "--gres=gpu:1", "--output=/dev/null",
                     "--wrap=srun true")
        assert wait_done(job) == "COMPLETED"
    finally:
        cluster.up(Shape())
    assert {n["name"] for n in cluster.status()["nodes"]} == {"n1", "n2", "n3"}


def test_down_stops_only_its_own_daemons_and_up_works_again(cluster: DevCluster) -> None:
    # A process that is not ours, with a name like ours, must survive `down`.
    bystander = subprocess.Popen(["bash", "-c", "exec -a slurmd sleep 120"])
    try:
        result = hpctrain("devcluster", "down")
        assert result.returncode == 0, result.stderr
        assert "slurmctld" in result.stdout
        assert our_processes(cluster) == []
        assert all(not d["alive"] for d in cluster.status()["daemons"])
        assert bystander.poll() is None, "down killed a process it did not start"
        assert hpctrain("devcluster", "status").returncode == 1
        result = hpctrain("devcluster", "up")
        assert result.returncode == 0, result.stderr
        assert "started" in result.stdout
        # every daemon comes back, sshd too when `up --ssh` set it up before (status lists it)
        assert all(d["alive"] for d in cluster.status()["daemons"])
        job = sbatch("--nodes=2", "--ntasks-per-node=1", "--output=/dev/null",
                     "--wrap=srun hostname")
        assert wait_done(job) == "COMPLETED"
    finally:
        bystander.kill()
        cluster.up(Shape())


def test_up_as_non_root_says_it_needs_root(tmp_path: Path) -> None:
    # as root: drop to nobody first; as an ordinary user (./dev.sh test): as is
    drop = [] if os.geteuid() != 0 else ["setpriv", "--reuid=65534", "--regid=65534",
                                         "--clear-groups"]
    result = subprocess.run(
        [*drop, sys.executable, "-m", "hpctrain", "devcluster", "up", "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    assert result.returncode == 4
    assert "must run as root" in result.stderr


def test_daemon_pid_files_are_checked_against_proc(cluster: DevCluster, tmp_path: Path) -> None:
    # A pid file naming a live process that is not the daemon is not trusted.
    fake = daemons.Daemon("slurmctld", ("x",), tmp_path / "x.pid", tmp_path / "x.log",
                          ("slurmctld", "nonexistent.conf"))
    fake.pid_file.write_text(str(os.getpid()))
    assert daemons.running_pid(fake) is None
    assert daemons.stop(fake) is False


def test_daemons_listen_on_loopback_only_and_munge_admits_every_user(
        cluster: DevCluster) -> None:
    """A shared login node must not expose slurmctld, slurmdbd, slurmd or MariaDB; every
    user's sbatch must reach munged, while its key stays root's."""
    ports = {cluster.ports.slurmctld, cluster.ports.slurmdbd, cluster.ports.mariadb,
             *(cluster.ports.slurmd_base + i for i in range(1, 4))}
    ours = {(addr, port) for addr, port in listeners() if port in ports}
    assert {port for _, port in ours} >= {cluster.ports.slurmctld, cluster.ports.slurmdbd}
    exposed = {(a, p) for a, p in ours if a not in ("127.0.0.1", "::1")}
    assert not exposed, f"devcluster daemons listen beyond loopback: {sorted(exposed)}"
    p = cluster.paths
    assert os.stat(p.munge_socket_dir).st_mode & 0o777 == 0o755
    assert os.stat(p.munge_socket).st_mode & 0o777 == 0o777  # munged's own default
    assert os.stat(p.munge_dir).st_mode & 0o777 == 0o700
