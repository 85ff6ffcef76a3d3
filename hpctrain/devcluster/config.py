"""Pure rendering of the devcluster's configuration files from its shape and paths.

Nothing here touches the machine: given a :class:`Shape` and a :class:`Paths`
layout it returns file contents, so the settings are easy to read and to test.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from hpctrain.devcluster import strict
from hpctrain.errors import DevclusterError
from hpctrain.slurm.partitions import DEVCLUSTER

# the name hpctrain's other commands know the devcluster by (its partitions' facts)
CLUSTER_NAME = DEVCLUSTER
# How the cluster counts what a job asks for. "strict" is a real site's (devcluster/strict.py):
# CPUs *and* memory are counted per job (a job that asks for no memory gets DefMemPerCPU per
# CPU), each task is bound to its CPUs and held to its memory by cgroups where the host has
# them, a step that goes over its memory is killed (OUT_OF_MEMORY), and a GPU partition `gpu`
# exists that no facts file describes: hpctrain must take its facts from Slurm.
SITES = ("lenient", "strict")
ACCOUNT = "hpctrain"
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
HOSTS_MARKER = "# hpctrain-devcluster"


@dataclass(frozen=True)
class Shape:
    """How many emulated nodes, and what each one offers."""

    nodes: int = 2
    gpus_per_node: int = 2
    cpus_per_node: int = 4
    mem_per_node_mb: int = 4000
    # nodes only partition `wide` has (besides all the others): room to leave a bad node
    # out, while `debug` and `urgent` stay full enough that an urgent job must preempt
    spare: int = 1
    # "lenient" counts CPUs only; "strict" counts and limits like real sites (SITES)
    site: str = "lenient"

    def __post_init__(self) -> None:
        if self.site not in SITES:
            raise DevclusterError(f"site={self.site!r}: use one of {', '.join(SITES)}")
        limits = {"nodes": (1, 64), "gpus_per_node": (0, 16), "cpus_per_node": (1, 256),
                  "mem_per_node_mb": (100, 1 << 22), "spare": (0, 8)}
        for key, (low, high) in limits.items():
            value = getattr(self, key)
            if not isinstance(value, int) or not low <= value <= high:
                raise DevclusterError(f"{key}={value!r} is out of range: use {low}..{high}")

    @property
    def node_names(self) -> list[str]:
        """Every emulated node, the spare ones last."""
        return [f"n{i}" for i in range(1, self.nodes + self.spare + 1)]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


# Several devclusters may run side by side on one machine (``--instance N``: the test
# suite gives each of its parallel workers one). Each is a whole cluster of its own (its own
# munged, MariaDB, slurmdbd, slurmctld and slurmds, state directory and ports), so nothing a
# test does to one (a node lost, slurm.conf rewritten, jobs preempted) touches another.
MAX_INSTANCES = 8
# Job ids of instance N start at N * 1,000,000 plus N * 5,000: ids never repeat across
# instances (job folders, state directories and node-local directories carry them) and
# the rendezvous ports derived from them (protocol.master_port: id mod 4,000) of jobs
# started at the same time on instances 0-3 lie 1,000 apart.
_JOB_IDS_PER_INSTANCE, _PORT_SHIFT_PER_INSTANCE = 1_000_000, 5_000


def check_instance(instance: int) -> int:
    """``instance`` if it is a devcluster instance number (0..MAX_INSTANCES-1)."""
    if isinstance(instance, bool) or not isinstance(instance, int) \
            or not 0 <= instance < MAX_INSTANCES:
        raise DevclusterError(f"devcluster instance {instance!r} is out of range: use "
                              f"0..{MAX_INSTANCES - 1}")
    return instance


def first_job_id(instance: int) -> int:
    """The first job id of devcluster ``instance`` (1 for instance 0)."""
    return instance * (_JOB_IDS_PER_INSTANCE + _PORT_SHIFT_PER_INSTANCE) + 1


def hosts_marker(instance: int) -> str:
    """The comment that ends the /etc/hosts line of devcluster ``instance``."""
    return HOSTS_MARKER + (f"-{instance}" if instance else "")


@dataclass(frozen=True)
class Ports:
    """TCP ports, away from Slurm's defaults so a real installation is not disturbed."""

    slurmctld: int = 16817
    slurmdbd: int = 16819
    mariadb: int = 16306
    slurmd_base: int = 17000  # node i listens on slurmd_base + i

    @classmethod
    def for_instance(cls, instance: int) -> "Ports":
        """Instance 0's ports are the defaults; instance N's lie 10*N above them (100*N
        for the slurmds: room for 64 nodes and 8 spares each)."""
        n = check_instance(instance)
        base = cls()
        return cls(base.slurmctld + 10 * n, base.slurmdbd + 10 * n, base.mariadb + 10 * n,
                   base.slurmd_base + 100 * n)


@dataclass(frozen=True)
class Paths:
    """Every file and directory the devcluster owns, all under one state directory."""

    root: Path

    etc = property(lambda self: self.root / "etc")
    run = property(lambda self: self.root / "run")
    log = property(lambda self: self.root / "log")
    spool = property(lambda self: self.root / "spool")
    ctld_state = property(lambda self: self.root / "ctld-state")
    fake_gpus = property(lambda self: self.root / "fake-gpus")
    mysql_data = property(lambda self: self.root / "mysql")
    munge_dir = property(lambda self: self.root / "munge")
    shared = property(lambda self: self.root / "shared")
    slurm_conf = property(lambda self: self.etc / "slurm.conf")
    gres_conf = property(lambda self: self.etc / "gres.conf")
    cgroup_conf = property(lambda self: self.etc / "cgroup.conf")   # the strict site's
    slurmdbd_conf = property(lambda self: self.etc / "slurmdbd.conf")
    shape_file = property(lambda self: self.root / "shape.json")
    munge_key = property(lambda self: self.munge_dir / "munge.key")
    # The socket lives apart from the key: every user may reach munged (munge's own
    # default, /run/munge is 0755 with a 0777 socket), nobody but root reads the key.
    munge_socket_dir = property(lambda self: self.root / "munge-socket")
    munge_socket = property(lambda self: self.munge_socket_dir / "munge.socket")
    mysql_run = property(lambda self: self.root / "mysql-run")  # owned by the mysql user
    mysql_socket = property(lambda self: self.mysql_run / "mysqld.sock")
    db_password_file = property(lambda self: self.etc / "db-password")
    oci_conf = property(lambda self: self.etc / "oci.conf")   # read by each container step
    images = property(lambda self: self.root / "images")
    host_image = property(lambda self: self.images / "host")  # an OCI bundle of this host
    runc_root = property(lambda self: self.run / "runc")      # runc's state of containers

    def pid_file(self, daemon: str) -> Path:
        """Pid file of a daemon: 'munged', 'mariadbd', 'slurmdbd', 'slurmctld', 'slurmd-n1'."""
        return self.run / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        return self.log / f"{daemon}.log"

    def fake_gpu_files(self, node: str, count: int) -> list[Path]:
        return [self.fake_gpus / f"{node}-gpu{i}" for i in range(count)]


def _node_range(count: int) -> str:
    return f"n[1-{count}]" if count > 1 else "n1"


def comm_params(loopback_host: bool, ctld: bool = True) -> str:
    """The CommunicationParameters line that keeps the daemons off other interfaces.

    Slurm 22.05 has no listen-address setting: with NoInAddrAny (NoCtldInAddrAny for
    slurmctld) a daemon binds the address its host name resolves to instead of 0.0.0.0.
    That is loopback only when the host name resolves to it (``loopback_host``); otherwise
    binding there would move the daemons *onto* the network, so the line is left out and
    a comment in its place says the daemons listen on every address.
    """
    if not loopback_host:
        return "# Host name does not resolve to loopback: daemons listen on all addresses."
    return "CommunicationParameters=" + ("NoInAddrAny,NoCtldInAddrAny" if ctld else "NoInAddrAny")


def slurm_conf(shape: Shape, paths: Paths, ports: Ports, hostname: str,
               loopback_host: bool = True, instance: int = 0, cgroups: bool = False) -> str:
    """slurm.conf for the emulated nodes, partitions `debug`, `urgent` and `wide`;
    ``cgroups``: the strict site binds cores and limits memory with them (cgroup.conf)."""
    nodes = "\n".join(
        f"NodeName={n} NodeHostname={hostname} NodeAddr=127.0.0.1 "
        f"Port={ports.slurmd_base + i} CPUs={shape.cpus_per_node} "
        f"RealMemory={shape.mem_per_node_mb}"
        + (f" Gres=gpu:{shape.gpus_per_node}" if shape.gpus_per_node else "")
        + " State=UNKNOWN"
        for i, n in enumerate(shape.node_names, start=1))
    return f"""\
# Written by `hpctrain devcluster up`; rewritten on every reshape. Do not edit.
ClusterName={CLUSTER_NAME}
SlurmctldHost={hostname}(127.0.0.1)
SlurmctldPort={ports.slurmctld}
SlurmdPort={ports.slurmd_base}
# Only this machine may talk to the daemons (a shared login node must not expose them).
{comm_params(loopback_host)}
SlurmUser=root
SlurmdUser=root
# Users see their own jobs, usage and user record only, as on most shared clusters: what
# hpctrain asks Slurm is always about the user's own jobs, and the tests prove it works so.
PrivateData=jobs,usage,users
AuthType=auth/munge
CredType=cred/munge
# Our own munged on our own socket; cred_expire is also how long a requeued job is
# held before it may start again (Slurm's default 120 s would make requeue tests slow;
# 5 is Slurm's minimum: a step launch must reach its slurmd within it).
AuthInfo=socket={paths.munge_socket},cred_expire=5
StateSaveLocation={paths.ctld_state}
SlurmdSpoolDir={paths.spool}/%n
SlurmctldPidFile={paths.pid_file('slurmctld')}
SlurmdPidFile={paths.run}/slurmd-%n.pid
SlurmctldLogFile={paths.log_file('slurmctld')}
SlurmdLogFile={paths.log}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Processes are tracked by their parent chain (works in containers, cgroups or not).
ProctrackType=proctrack/linuxproc
{strict.task_plugin(shape.site, cgroups)}
# Nodes may declare more CPUs/GPUs than this machine has.
SlurmdParameters=config_overrides
SelectType=select/cons_tres
{strict.counting(shape.site)}
SchedulerType=sched/backfill
# Slurm's default preemption: when GraceTime starts the job's *steps* get SIGTERM (the
# batch step nothing until the requeue at its end). Sites that set
# SlurmctldParameters=preempt_send_user_signal send the job's --signal instead (B:USR2:
# to the batch step only); hpctrain's supervisor handles both, and a test switches it on.
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
GresTypes=gpu
ReturnToService=2
JobRequeue=1
# Node loss is noticed within seconds, not Slurm's default 5 minutes.
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=10
KillWait=10
InactiveLimit=0
MinJobAge=600
# instance {instance} of the devclusters on this machine: its job ids are its own
FirstJobId={first_job_id(instance)}
MaxArraySize=1001
# Slurm's default 10,000 is below one 10,000-point sweep once its tasks are records of
# their own (started or cancelled): new jobs are then refused until MinJobAge passes
MaxJobCount=50000
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={ports.slurmdbd}
# For slurmdbd connections Slurm takes the munge socket from here, not from AuthInfo.
AccountingStoragePass={paths.munge_socket}
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
{strict.gathering(shape.site, cgroups)}
JobCompType=jobcomp/none
{nodes}
PartitionName=debug Nodes={_node_range(shape.nodes)} Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=10 MaxTime=1-00:00:00 State=UP
PartitionName=urgent Nodes={_node_range(shape.nodes)} PriorityTier=10 PreemptMode=OFF MaxTime=04:00:00 State=UP
PartitionName=wide Nodes={_node_range(shape.nodes + shape.spare)} PriorityTier=1 PreemptMode=REQUEUE GraceTime=10 MaxTime=1-00:00:00 State=UP
{strict.partitions(shape.site, _node_range(shape.nodes))}"""


def gres_conf(shape: Shape, paths: Paths) -> str:
    """gres.conf: each fake GPU is an empty file, enough for Slurm to count and bind it."""
    lines = ["# Written by `hpctrain devcluster up`: fake GPUs, one empty file each."]
    count = shape.gpus_per_node
    for node in shape.node_names if count else ():
        files = f"{node}-gpu[0-{count - 1}]" if count > 1 else f"{node}-gpu0"
        lines.append(f"NodeName={node} Name=gpu File={paths.fake_gpus}/{files}")
    return "\n".join(lines) + "\n"


def login_users(entries: Iterable[tuple[str, int, str]]) -> list[str]:
    """The login accounts among (name, uid, shell) entries: uid 1000-59999 (Debian's
    UID_MIN/UID_MAX) with a shell that is not nologin/false. Pure."""
    return sorted(name for name, uid, shell in entries
                  if 1000 <= uid < 60000 and not shell.endswith(("nologin", "false")))


def slurmdbd_conf(paths: Paths, ports: Ports, db_password: str,
                  loopback_host: bool = True) -> str:
    """slurmdbd.conf (must be mode 600: it holds the database password)."""
    return f"""\
# Written by `hpctrain devcluster up`. Do not edit.
AuthType=auth/munge
AuthInfo=socket={paths.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={ports.slurmdbd}
{comm_params(loopback_host, ctld=False)}
SlurmUser=root
# as slurm.conf's: sacct lists a user's own jobs only
PrivateData=jobs,usage,users
PidFile={paths.pid_file('slurmdbd')}
LogFile={paths.log_file('slurmdbd')}
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports.mariadb}
StorageUser={DB_USER}
StoragePass={db_password}
StorageLoc={DB_NAME}
"""


def db_setup_sql(db_password: str) -> str:
    """SQL that makes the accounting database and its user; safe to run again."""
    return (f"CREATE DATABASE IF NOT EXISTS {DB_NAME};\n"
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{db_password}';\n"
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{db_password}';\n"
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';\n"
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'localhost';\n"
            "FLUSH PRIVILEGES;\n")


def hosts_line(shape: Shape, instance: int = 0) -> str:
    """The /etc/hosts line that makes node names resolve (rendezvous needs it). Instances
    share node names (n1, n2, ...), all 127.0.0.1; each keeps a line of its own, so one
    instance reshaped or brought down leaves the others' names resolving."""
    return f"127.0.0.1 {' '.join(shape.node_names)} {hosts_marker(instance)}"


def updated_hosts(current: str, shape: Shape | None, instance: int = 0) -> str:
    """/etc/hosts text with instance ``instance``'s line replaced (or removed when
    ``shape`` is None)."""
    marker = hosts_marker(instance)
    kept = [line for line in current.splitlines() if not line.endswith(" " + marker)]
    if shape is not None:
        kept.append(hosts_line(shape, instance))
    return "\n".join(kept) + "\n"
