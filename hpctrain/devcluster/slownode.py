"""Making one emulated devcluster node slow, for real (fail-slow faults to test against).

The emulated nodes share this machine, so "a slow node" is its processes held to less CPU
time: the cgroup v1 CPU controller's quota (``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``)
for one group that holds the node's slurmd and every process of a job on that node. What
the slurmd starts later (the stepds, the ranks of the next step or job) is born in its
group, so a node slowed before a job is slow from its first step; slowed while a job runs,
its ranks there slow down at once and their peers wait for them at every collective, as
behind a GPU that throttles.

A node's processes are found through /proc: its slurmd by its pid file, the jobs' ones by
their environment (``SLURMD_NODENAME`` and this cluster's ``SLURM_CONF``: several
devclusters may name their nodes alike), their slurmstepds as those processes' ancestors.
:func:`restore` moves everything back to the root group and removes the group.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.errors import DevclusterError

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")   # cgroup v1's CPU controller (root may write it)
PERIOD_US = 100_000                       # the kernel's default period: 100 ms
MIN_CPUS = 0.01                           # the kernel's floor is a 1 ms quota


def group_path(instance: int, node: str, root: Path = CPU_CGROUP) -> Path:
    """The CPU group of ``node`` of devcluster ``instance``."""
    return root / f"hpctrain-slow-{instance}-{node}"


def _environ(pid: int) -> set[bytes]:
    try:
        return set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
    except OSError:
        return set()


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def node_processes(node: str, slurm_conf: Path, slurmd: int | None) -> set[int]:
    """The processes of ``node``: its slurmd (``slurmd``: its pid, None when it is not
    running), every job process there (``SLURMD_NODENAME=node`` with this cluster's
    ``SLURM_CONF``) and their slurmstepds."""
    want = {f"SLURMD_NODENAME={node}".encode(), f"SLURM_CONF={slurm_conf}".encode()}
    found = {int(p) for p in os.listdir("/proc") if p.isdigit() and want <= _environ(int(p))}
    for pid in list(found):
        up = _parent(pid)
        while up > 1:
            if _comm(up) == "slurmstepd":
                found.add(up)
            up = _parent(up)
    return found | ({slurmd} if slurmd else set())


def quota_us(cpus: float) -> int:
    """The quota per PERIOD_US that holds a group to ``cpus`` CPUs' worth of time."""
    if not MIN_CPUS <= cpus <= 1024:
        raise DevclusterError(f"--cpus {cpus:g}: give the CPU time the node may use, in CPUs, "
                              f"from {MIN_CPUS:g} to 1024 (0.5: half of one CPU)")
    return max(1000, round(cpus * PERIOD_US))


def _writable(root: Path) -> None:
    if not (root / "cpu.cfs_quota_us").exists():
        raise DevclusterError(f"no cgroup v1 CPU controller at {root}: a slow node needs it "
                              "(cpu.cfs_quota_us); on a cgroup v2-only machine it cannot be "
                              "emulated this way")
    if not os.access(root, os.W_OK):
        raise DevclusterError(f"{root} is not writable: run `hpctrain devcluster slow` as root")


def slow(instance: int, node: str, cpus: float, pids: set[int],
         root: Path = CPU_CGROUP) -> int:
    """Hold ``pids`` (:func:`node_processes`) and what they start to ``cpus`` CPUs' worth
    of time together; how many processes were moved (a process gone meanwhile is skipped).
    Slowing a slowed node again changes its quota."""
    _writable(root)
    quota = quota_us(cpus)
    group = group_path(instance, node, root)
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
    (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    return _move(pids, group)


def restore(instance: int, node: str, root: Path = CPU_CGROUP) -> int:
    """``node`` at full speed again: its group's processes back in the root group and the
    group removed; how many were moved (0 when it was not slow)."""
    group = group_path(instance, node, root)
    if not group.exists():
        return 0
    _writable(root)
    moved = 0
    for _ in range(5):     # a process may fork while its siblings move
        pids = {int(p) for p in (group / "cgroup.procs").read_text().split()}
        if not pids:
            break
        moved += _move(pids, root)
    try:
        group.rmdir()
    except OSError as exc:
        raise DevclusterError(f"could not remove {group} ({exc.strerror}): a process is "
                              "still in it; run `hpctrain devcluster slow --off` again") from None
    return moved


def _move(pids: set[int], group: Path) -> int:
    moved = 0
    for pid in sorted(pids):
        try:
            (group / "cgroup.procs").write_text(f"{pid}\n")
            moved += 1
        except ProcessLookupError:
            pass          # it ended meanwhile
        except OSError as exc:
            if exc.errno != 3:      # ESRCH: gone
                raise DevclusterError(f"could not move process {pid} into {group}: "
                                      f"{exc.strerror}") from None
    return moved
