"""The strict site (``devcluster up --site strict``): what it counts and how it limits.

A real site counts CPUs *and* memory per job (a job that asks for no memory gets
DefMemPerCPU per CPU), binds each task to its CPUs and has the kernel hold each job to its
memory: Slurm's ``task/cgroup`` (cpuset and memory controllers, here cgroup v1) with
``task/affinity`` binding each task inside its step's cpuset. Where this machine has no
cgroup v1 hierarchy for those controllers (a pure cgroup v2 host), the strict site still
counts, and Slurm's accounting poller (``OverMemoryKill``) ends a step over its memory
instead of the kernel; cores are then not bound. Pure but for :func:`host_missing`, which
reads this host's mount table.

Found on this machine kind (Debian 12's Slurm 22.05, hybrid cgroups, several slurmds on one
host; 2026-11-27): each emulated node gets a hierarchy of its own (``/slurm_<node>`` under
each controller), the kernel's OOM killer ends a step over its memory ("Detected 1 oom-kill
event(s)": Slurm says OUT_OF_MEMORY), and with ``task/affinity`` each task's
``sched_getaffinity`` is exactly its ``--cpus-per-task`` *when the node declares no more CPUs
than the machine has* (a node that declares more gets masks that do not add up), hence
:func:`check_cpus`. Slurm refuses to start with both the cgroup memory limit and
``OverMemoryKill`` ("two incompatible memory enforcement mechanisms").
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.errors import DevclusterError

DEF_MEM_PER_CPU_MB = 256
CGROUP_ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("cpuset", "memory")      # cores bound, memory held by the kernel


def cgroup_v1_missing(mounts: str) -> str:
    """'' when ``mounts`` (the text of /proc/self/mounts) has a cgroup v1 hierarchy for each
    of CONTROLLERS under /sys/fs/cgroup (what Slurm's cgroup/v1 plugin uses); else what is
    missing, in words."""
    found: set[str] = set()
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and fields[1].startswith(CGROUP_ROOT):
            found.update(o for o in fields[3].split(",") if o in CONTROLLERS)
    missing = [c for c in CONTROLLERS if c not in found]
    if not missing:
        return ""
    return (f"no cgroup v1 hierarchy for {' and '.join(missing)} under {CGROUP_ROOT} (a "
            "cgroup v2-only host)")


def host_missing(mounts: str = "/proc/self/mounts") -> str:
    """:func:`cgroup_v1_missing` of this host (a mount table it cannot read: all missing)."""
    try:
        return cgroup_v1_missing(Path(mounts).read_text())
    except OSError as exc:
        return f"cannot read {mounts}: {exc.strerror}"


def default_cpus(lenient: int, machine_cpus: int) -> int:
    """The strict site's CPUs per node: the lenient site's (``lenient``), but never more
    than this machine has (a node cannot bind cores it does not have)."""
    return max(1, min(lenient, machine_cpus))


def check_cpus(cpus_per_node: int, machine_cpus: int) -> None:
    """Refuse nodes that declare more CPUs than the machine has when cgroups bind cores."""
    if cpus_per_node > machine_cpus:
        raise DevclusterError(
            f"--cpus-per-node={cpus_per_node} is more than this machine's {machine_cpus} "
            "CPUs: the strict site binds each task to its CPUs (task/cgroup), and a node "
            f"cannot bind CPUs it does not have; use --cpus-per-node {machine_cpus} or "
            "fewer (the strict site's default), or the lenient site")


def counting(site: str) -> str:
    """slurm.conf's SelectTypeParameters (and DefMemPerCPU) for ``site``."""
    if site == "lenient":
        return "SelectTypeParameters=CR_Core"
    return ("# strict: CPUs and memory are counted per job, as at real sites; a job that asks\n"
            "# for no memory gets DefMemPerCPU for each of its CPUs\n"
            "SelectTypeParameters=CR_Core_Memory\n"
            f"DefMemPerCPU={DEF_MEM_PER_CPU_MB}")


def task_plugin(site: str, cgroups: bool) -> str:
    """slurm.conf's TaskPlugin line: cgroups on the strict site where the host has them."""
    if site == "strict" and cgroups:
        return ("# strict: each step in a cgroup of its node's (cpuset, memory: cgroup.conf),\n"
                "# each task bound to its own CPUs in it\n"
                "TaskPlugin=task/affinity,task/cgroup")
    return "TaskPlugin=task/none"


def gathering(site: str, cgroups: bool) -> str:
    """slurm.conf's accounting poller: who ends a step over its memory."""
    if site == "lenient":
        return "JobAcctGatherFrequency=30"
    if cgroups:   # the kernel does (Slurm refuses OverMemoryKill beside the cgroup's limit)
        return "JobAcctGatherFrequency=2"
    # no cgroups on this host: the accounting poller kills a step over its memory
    return "JobAcctGatherFrequency=2\nJobAcctGatherParams=OverMemoryKill"


def partitions(site: str, node_range: str) -> str:
    """The strict site's extra partition ``gpu``, which no facts file describes."""
    if site == "lenient":
        return ""
    return (f"# strict: a GPU partition as sites name them, which no facts file describes\n"
            f"PartitionName=gpu Nodes={node_range} PriorityTier=1 "
            "PreemptMode=OFF MaxTime=04:00:00 State=UP\n")


def limits(site: str, missing: str) -> str:
    """In words, what holds a job to the CPUs and memory it asked for on ``site``, where
    ``missing`` is :func:`cgroup_v1_missing`'s word on this host."""
    if site == "lenient":
        return "none: CPUs are counted, memory is not, no core is bound"
    if not missing:
        return "cgroups: each task bound to its CPUs, each job held to its memory by the kernel"
    return f"Slurm's accounting poller ends a step over its memory; no core is bound ({missing})"


def cgroup_conf() -> str:
    """cgroup.conf beside slurm.conf (slurmd and slurmstepd read it from there)."""
    return f"""\
# Written by `hpctrain devcluster up --site strict`. Do not edit.
# cgroup v1 (this host's cpuset and memory hierarchies); each slurmd makes /slurm_<node>.
CgroupPlugin=cgroup/v1
CgroupMountpoint={CGROUP_ROOT}
# each step's CPUs are its cpuset; its memory (--mem, --mem-per-gpu, DefMemPerCPU) is the
# memory cgroup's limit, and the kernel's OOM killer ends a step that goes over it
ConstrainCores=yes
ConstrainRAMSpace=yes
# no device constraint: the fake GPUs are plain files, not devices
ConstrainDevices=no
"""
