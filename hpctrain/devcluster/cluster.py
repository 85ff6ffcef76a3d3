"""``DevCluster``: bring the local SLURM cluster up, report on it, bring it down.

Order of start: munge -> MariaDB -> slurmdbd (+ accounting records) -> slurmctld ->
one slurmd per emulated node. ``down`` stops the same daemons in reverse, each only
through the pid file this module wrote. A reshape restarts slurmctld and the slurmds
with the new configuration and keeps munge, MariaDB and slurmdbd running.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import secrets
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from hpctrain.devcluster import accounting, config, daemons, slownode, sshd, strict
from hpctrain.devcluster.config import Paths, Ports, Shape
from hpctrain.devcluster.containers import ensure_host_image
from hpctrain.devcluster.nodestates import node_held, node_usable
from hpctrain.devcluster.packages import ensure_packages
from hpctrain.errors import DevclusterError, SlurmError
from hpctrain.slurm import client
from hpctrain.slurm.parse import parse_kv_records

DEFAULT_STATE_DIR = "/var/lib/hpctrain/devcluster"
STATE_DIR_ENV = "HPCTRAIN_DEVCLUSTER_DIR"
INSTANCE_ENV = "HPCTRAIN_DEVCLUSTER_INSTANCE"
SYSTEM_SLURM_CONF = Path("/etc/slurm/slurm.conf")
HOSTS_FILE = Path("/etc/hosts")
READY_TIMEOUT_S = 60.0
def _hostname_is_loopback() -> bool:
    """Whether every address this host's name resolves to is a loopback address (then
    Slurm's NoInAddrAny binds the daemons to loopback only; see config.comm_params)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


@dataclass(frozen=True)
class UpResult:
    """What :meth:`DevCluster.up` did: "started", "reshaped" or "already up", and the nodes
    it had to resume (see :meth:`DevCluster.make_nodes_usable`)."""

    outcome: str
    resumed: tuple[str, ...] = ()


def instance_from_env(env: Mapping[str, str] = os.environ) -> int:
    """The devcluster instance ``$HPCTRAIN_DEVCLUSTER_INSTANCE`` names (0 when unset)."""
    value = env.get(INSTANCE_ENV, "").strip() or "0"
    if not value.isdigit():
        raise DevclusterError(f"{INSTANCE_ENV}={value!r} is not an instance number: use "
                              f"0..{config.MAX_INSTANCES - 1}")
    return config.check_instance(int(value))


def default_state_dir(instance: int) -> str:
    """Instance 0 lives in /var/lib/hpctrain/devcluster, instance N beside it in ...-N."""
    return DEFAULT_STATE_DIR + (f"-{instance}" if instance else "")


class DevCluster:
    """A real SLURM cluster of emulated nodes on this machine, owned through one state dir.

    ``instance`` (default ``$HPCTRAIN_DEVCLUSTER_INSTANCE``, else 0) picks one of several
    independent devclusters side by side: its own state dir, ports and job ids."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None,
                 ports: Ports | None = None, instance: int | None = None) -> None:
        self.instance = instance_from_env() if instance is None \
            else config.check_instance(instance)
        root = state_dir or os.environ.get(STATE_DIR_ENV) or default_state_dir(self.instance)
        self.paths = Paths(Path(root).resolve())
        self.ports = ports or Ports.for_instance(self.instance)

    # ---- what clients and tests need -------------------------------------------------
    def client_env(self) -> dict[str, str]:
        """Environment that points Slurm clients (and jobs) at this cluster."""
        return {"SLURM_CONF": str(self.paths.slurm_conf)}

    @property
    def shared_dir(self) -> Path:
        """Shared storage every emulated node sees (they are all this machine)."""
        return self.paths.shared

    def shape(self) -> Shape | None:
        """The shape the cluster was last brought up with, if any."""
        try:
            return Shape(**json.loads(self.paths.shape_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    # ---- daemons -----------------------------------------------------------------------
    def _daemons(self, shape: Shape) -> list[daemons.Daemon]:
        p = self.paths
        conf = str(p.slurm_conf)

        def d(name: str, argv: list[str], match: tuple[str, ...], forks: bool = True) -> daemons.Daemon:
            return daemons.Daemon(name, tuple(argv), p.pid_file(name), p.log_file(name), match, forks)

        result = [
            d("munged", ["/usr/sbin/munged", f"--socket={p.munge_socket}",
                         f"--key-file={p.munge_key}", f"--pid-file={p.pid_file('munged')}",
                         f"--log-file={p.log_file('munged')}", f"--seed-file={p.munge_dir}/seed",
                         "--force"], ("munged", str(p.munge_key))),  # the key path never moved
            # MariaDB runs as `mysql`, so its socket, pid and log live in a dir it owns.
            daemons.Daemon("mariadbd", (
                "/usr/sbin/mariadbd", "--no-defaults", f"--datadir={p.mysql_data}",
                f"--socket={p.mysql_socket}", f"--port={self.ports.mariadb}",
                "--bind-address=127.0.0.1", f"--pid-file={p.mysql_run}/mariadbd.pid",
                "--user=mysql", f"--log-error={p.mysql_run}/mariadbd.log", "--skip-log-bin",
                "--innodb-buffer-pool-size=64M"), p.mysql_run / "mariadbd.pid",
                p.mysql_run / "mariadbd-stdout.log", ("mariadbd", str(p.mysql_data)), forks=False),
            d("slurmdbd", ["/usr/sbin/slurmdbd"], ("slurmdbd",)),
            d("slurmctld", ["/usr/sbin/slurmctld", "-i", "-f", conf], ("slurmctld", conf)),
        ]
        result += [d(f"slurmd-{n}", ["/usr/sbin/slurmd", "-N", n, "-f", conf], ("slurmd", n, conf))
                   for n in shape.node_names]
        return result

    def _daemon_env(self) -> dict[str, str]:
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
                **self.client_env()}

    # ---- up ------------------------------------------------------------------------------
    def up(self, shape: Shape = Shape()) -> UpResult:
        """Bring the cluster up in ``shape`` with every node usable (see :class:`UpResult`)."""
        if os.geteuid() != 0:
            raise DevclusterError("`hpctrain devcluster up` must run as root: it installs Debian "
                                  "packages and starts munged, MariaDB, slurmdbd, slurmctld and "
                                  "slurmd (try `sudo hpctrain devcluster up`)")
        ensure_packages()
        with self._lock():
            previous = self.shape()
            wanted = self._daemons(shape)
            fresh = previous == shape and not self._configs_changed(shape)
            if fresh and all(daemons.running_pid(d) for d in wanted):
                ensure_host_image(self.paths)  # cheap; a cluster from before 0.2 gets it
                accounting.register(self.client_env())   # users made since the last `up`
                self._keep_ssh()
                return UpResult("already up", self.make_nodes_usable(shape))
            if self.cgroups(shape):
                strict.check_cpus(shape.cpus_per_node, os.cpu_count() or 1)
            self._prepare_dirs(shape)
            # A new shape (or settings from a newer hpctrain) needs slurmctld and the
            # slurmds restarted; munge, MariaDB and slurmdbd keep running.
            reshaped = previous is not None and not fresh
            if reshaped and previous is not None:
                for d in reversed(self._daemons(previous)[3:]):  # slurmctld + slurmds
                    daemons.stop(d)
            self._write_configs(shape)
            env = self._daemon_env()
            munge, mariadb, slurmdbd, ctld, *slurmds = wanted
            daemons.start(munge, env)
            accounting.start_database(self.paths, mariadb, env)
            daemons.start(slurmdbd, env)
            accounting.register(self.client_env())
            daemons.start(ctld, env)
            for d in slurmds:
                daemons.start(d, env)
            resumed = self.make_nodes_usable(shape)
            ensure_host_image(self.paths)
            self.paths.shape_file.write_text(shape.to_json())
            self._link_system_conf()
            self._keep_ssh()
            return UpResult("reshaped" if reshaped else "started", resumed)

    def up_ssh(self, port: int, users: Sequence[str]) -> list[str]:
        """Add the SSH login (``up --ssh``, :mod:`hpctrain.devcluster.sshd`) for ``users``
        on 127.0.0.1:``port``, to a cluster that is up; idempotent. Returns what to tell
        the operator (the host alias per user, accounts changed, hints)."""
        if os.geteuid() != 0:
            raise DevclusterError("`hpctrain devcluster up --ssh` must run as root: it "
                                  "installs and starts sshd (try `sudo hpctrain devcluster "
                                  "up --ssh`)")
        ensure_packages(extra=sshd.SSH_PACKAGES)
        with self._lock():
            return sshd.up(self.paths.root, port, users, self._daemon_env())

    def _keep_ssh(self) -> None:
        """A cluster once set up with ``--ssh`` keeps its SSH login across ``down``/``up``
        (``status`` lists it, so ``up`` must bring it back too)."""
        if sshd.configured(self.paths.root):
            sshd.start(self.paths.root, self._daemon_env())

    def _all_daemons(self, shape: Shape) -> list[daemons.Daemon]:
        """The cluster's daemons, and the SSH server when ``up --ssh`` set it up."""
        extra = [sshd.daemon(self.paths.root)] if sshd.configured(self.paths.root) else []
        return self._daemons(shape) + extra

    @contextmanager
    def _lock(self) -> Iterator[None]:
        self.paths.root.mkdir(parents=True, exist_ok=True)
        with open(self.paths.root / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # concurrent `up`s (parallel tests) wait their turn
            yield

    def _prepare_dirs(self, shape: Shape) -> None:
        p = self.paths
        for d in (p.etc, p.run, p.log, p.ctld_state, p.fake_gpus, p.shared):
            d.mkdir(parents=True, exist_ok=True)
        p.shared.chmod(0o1777)  # like /tmp: every user's jobs can write checkpoints there
        for node in shape.node_names:
            (p.spool / node).mkdir(parents=True, exist_ok=True)
            for f in p.fake_gpu_files(node, shape.gpus_per_node):
                f.touch()
        p.munge_dir.mkdir(mode=0o700, exist_ok=True)
        p.munge_socket_dir.mkdir(exist_ok=True)
        p.munge_socket_dir.chmod(0o755)  # every user's sbatch reaches munged; the key stays 0700
        if not p.munge_key.exists():
            p.munge_key.write_bytes(secrets.token_bytes(1024))
        p.munge_key.chmod(0o400)
        if not p.db_password_file.exists():
            p.db_password_file.write_text(secrets.token_hex(16))
        p.db_password_file.chmod(0o600)
        hosts = HOSTS_FILE.read_text() if HOSTS_FILE.exists() else ""
        new_hosts = config.updated_hosts(hosts, shape, self.instance)
        if new_hosts != hosts:
            HOSTS_FILE.write_text(new_hosts)

    def _slurm_configs(self, shape: Shape) -> dict[Path, str]:
        p = self.paths
        cgroups = self.cgroups(shape)
        configs = {p.slurm_conf: config.slurm_conf(shape, p, self.ports, socket.gethostname(),
                                                   _hostname_is_loopback(), self.instance,
                                                   cgroups),
                   p.gres_conf: config.gres_conf(shape, p)}
        if cgroups:
            configs[p.cgroup_conf] = strict.cgroup_conf()
        return configs

    @staticmethod
    def cgroups(shape: Shape) -> bool:
        """Does it bind cores and limit memory with cgroups (devcluster/strict.py)?"""
        return shape.site == "strict" and not strict.host_missing()

    def _configs_changed(self, shape: Shape) -> bool:
        for path, text in self._slurm_configs(shape).items():
            try:
                if path.read_text() != text:
                    return True
            except OSError:
                return True
        return False

    def _write_configs(self, shape: Shape) -> None:
        p = self.paths
        for path, text in self._slurm_configs(shape).items():
            path.write_text(text)
        p.slurmdbd_conf.write_text(config.slurmdbd_conf(p, self.ports,
                                                        p.db_password_file.read_text().strip(),
                                                        _hostname_is_loopback()))
        p.slurmdbd_conf.chmod(0o600)  # slurmdbd refuses a readable config (it holds a password)

    def make_nodes_usable(self, shape: Shape | None = None) -> tuple[str, ...]:
        """Wait until Slurm would place jobs on every node. A stopped slurmd is started; a
        node an earlier run left DOWN or DRAIN (a node-loss test, Slurm's "Duplicate jobid"
        drain) is resumed, once: on this cluster nobody else has a reason to keep a node
        out. Returns one note per node resumed, e.g. "n2 (was IDLE+DRAIN: Duplicate jobid)"."""
        shape = shape or self.shape()
        if shape is None:
            raise DevclusterError("the devcluster was never brought up: "
                                  "run `hpctrain devcluster up`")
        for daemon in self._daemons(shape):
            if daemon.name.startswith("slurmd-"):  # a node's; the control daemons are up
                daemons.start(daemon, self._daemon_env())
        deadline = time.monotonic() + READY_TIMEOUT_S
        resumed: dict[str, str] = {}
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            records = {n.get("NodeName", ""): n for n in self.nodes()}
            states = {name: records.get(name, {}).get("State", "") for name in shape.node_names}
            if all(node_usable(state) for state in states.values()):
                return tuple(resumed.values())
            for name, state in states.items():
                if name not in resumed and node_held(state):
                    client.run(["scontrol", "update", f"nodename={name}", "state=resume"],
                               env=self.client_env(), check=False)
                    reason = records[name].get("Reason", "").split(" [")[0]
                    resumed[name] = f"{name} (was {state}{': ' + reason if reason else ''})"
            time.sleep(0.5)
        raise DevclusterError(f"nodes not ready within {READY_TIMEOUT_S:g}s: {states}; see "
                              f"{self.paths.log}/slurmd-*.log and slurmctld.log")

    def _link_system_conf(self) -> None:
        """Point /etc/slurm/slurm.conf at ours, unless a real site config lives there (or
        this is not instance 0: the others are reached through SLURM_CONF only)."""
        if self.instance:
            return
        link = SYSTEM_SLURM_CONF
        if link.is_symlink() or not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() and Path(os.readlink(link)) == self.paths.slurm_conf:
                return
            link.unlink(missing_ok=True)
            link.symlink_to(self.paths.slurm_conf)

    # ---- status ------------------------------------------------------------------------
    def nodes(self) -> list[dict[str, str]]:
        """``scontrol show node`` records (empty when the controller is down)."""
        return self._show("node")

    def partitions(self) -> list[dict[str, str]]:
        return self._show("partition")

    def _show(self, entity: str) -> list[dict[str, str]]:
        if not self.paths.slurm_conf.exists():
            return []
        try:
            out = client.run(["scontrol", "show", entity, "--oneliner"], env=self.client_env(),
                             timeout=10, retries=0).stdout
        except SlurmError:
            return []
        return parse_kv_records(out)

    def status(self) -> dict[str, Any]:
        """Daemons, nodes and partitions, as a JSON-able dict."""
        shape = self.shape()
        known = self._all_daemons(shape) if shape else []
        daemon_rows = [{"name": d.name, "pid": daemons.running_pid(d),
                        "alive": daemons.running_pid(d) is not None} for d in known]
        ctld_alive = any(r["alive"] for r in daemon_rows if r["name"] == "slurmctld")
        return {
            "instance": self.instance,
            "state_dir": str(self.paths.root),
            "slurm_conf": str(self.paths.slurm_conf),
            "shared_dir": str(self.paths.shared),
            "shape": json.loads(shape.to_json()) if shape else None,
            # who holds a job to its CPUs and memory (the strict site): the kernel's
            # cgroups, Slurm's accounting poller, or nobody (the lenient site)
            "limits": strict.limits(shape.site, strict.host_missing()) if shape else None,
            "daemons": daemon_rows,
            # port, users, alias of the SSH login (`up --ssh`); None when never set up
            "ssh": sshd.settings(self.paths.root) if shape else None,
            "nodes": [{"name": n.get("NodeName"), "state": n.get("State"),
                       "gres": n.get("Gres"), "cpus": n.get("CPUTot"),
                       "partitions": n.get("Partitions")} for n in self.nodes()] if ctld_alive else [],
            "partitions": [{"name": p.get("PartitionName"), "nodes": p.get("Nodes"),
                            "default": p.get("Default") == "YES",
                            "priority_tier": p.get("PriorityTier"),
                            "preempt_mode": p.get("PreemptMode"),
                            "grace_time": p.get("GraceTime"), "state": p.get("State")}
                           for p in self.partitions()] if ctld_alive else [],
        }

    # ---- losing a daemon (tests of node loss and of a controller outage) -----------------
    def stop_daemon(self, name: str) -> bool:
        """Stop one daemon: ``slurmctld``, ``slurmd-n2``, ... (a node's jobs' processes are
        the caller's business); False when it was not running."""
        return daemons.stop(self._daemon(name))

    def daemon_pid(self, name: str) -> int | None:
        """The pid of one running daemon (``slurmd-n2``), or None (a test's power loss)."""
        return daemons.running_pid(self._daemon(name))

    def start_daemon(self, name: str) -> None:
        daemon = self._daemon(name)
        if name == "sshd":
            sshd.start(self.paths.root, self._daemon_env())   # makes /run/sshd first
        else:
            daemons.start(daemon, self._daemon_env())

    def _daemon(self, name: str) -> daemons.Daemon:
        shape = self.shape()
        known = self._all_daemons(shape) if shape else []
        found = [d for d in known if d.name == name]
        if not found:
            names = [d.name for d in known]
            raise DevclusterError(f"no devcluster daemon {name!r}: daemons are "
                                  f"{', '.join(names) or 'none (not up)'}")
        return found[0]

    # ---- a slow node (fail-slow faults, :mod:`.slownode`) ---------------------------------
    def slow_node(self, node: str, cpus: float) -> int:
        """Hold ``node``'s slurmd and its jobs' processes (and what they start) to ``cpus``
        CPUs' worth of time; how many processes were moved."""
        pid = self.daemon_pid(f"slurmd-{node}")   # an unknown node: DevclusterError
        pids = slownode.node_processes(node, self.paths.slurm_conf, pid)
        return slownode.slow(self.instance, node, cpus, pids)

    def restore_node(self, node: str) -> int:
        """``node`` at full speed again; how many processes were moved back."""
        self._daemon(f"slurmd-{node}")
        return slownode.restore(self.instance, node)

    # ---- down ----------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Stop every daemon this cluster started (by pid file); returns the names stopped."""
        shape = self.shape()
        if shape is None:
            return []
        with self._lock():
            if any(daemons.running_pid(d) for d in self._daemons(shape) if d.name == "slurmctld"):
                # Jobs on a cluster going away would leave orphaned slurmstepds behind.
                env = self.client_env()
                jobs = client.run(["squeue", "-h", "-o", "%A"], env=env, check=False,
                                  timeout=10, retries=0).stdout.split()
                if jobs:
                    client.run(["scancel", *jobs], env=env, check=False, timeout=10, retries=0)
            stopped = [d.name for d in reversed(self._all_daemons(shape)) if daemons.stop(d)]
            hosts = HOSTS_FILE.read_text() if HOSTS_FILE.exists() else ""
            if config.hosts_marker(self.instance) in hosts:
                HOSTS_FILE.write_text(config.updated_hosts(hosts, None, self.instance))
            return stopped
