"""The sysadmin's hand in the tests: what only root may do on a cluster (bring the devcluster
up, kill a node's slurmd, mark a node DOWN, restart slurmctld, create users, hand a file
to another user).

The suite runs as an ordinary user (``./dev.sh test`` runs it as ``hpct-alice``, see
docs/security.md), so everything a researcher does is checked by the kernel and by Slurm
as for any user. The few operator actions go through ``sudo -n`` here, in one place, and
nowhere else; run as root, they run directly.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any, Sequence

from helpers.prereq import require

# what a root child needs of this process's environment
_KEEP = ("SLURM_CONF", "HPCTRAIN_DEVCLUSTER_DIR", "HPCTRAIN_DEVCLUSTER_INSTANCE", "PYTHONPATH",
         "PYTHONDONTWRITEBYTECODE")


def is_root() -> bool:
    return os.geteuid() == 0


def _sudo(argv: Sequence[str], user: str = "root") -> list[str]:
    if is_root() and user == "root":
        return list(argv)
    keep = [f"{k}={os.environ[k]}" for k in _KEEP if k in os.environ]
    return ["sudo", "-n", "-u", user, "env", *keep, *argv]


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 300,
        user: str = "root", **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as root (or as ``user``); fails the test with its output when it fails."""
    res = subprocess.run(_sudo([str(a) for a in argv], user), capture_output=True, text=True,
                         timeout=timeout, **kw)
    if check:
        assert res.returncode == 0, (f"as {user}: {list(argv)} -> {res.returncode}\n"
                                     f"{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return res


def require_sudo() -> None:
    """Fail (CI) or skip (locally) when this user cannot act as root without a password."""
    if is_root():
        return
    ok = subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0 \
        if os.path.exists("/usr/bin/sudo") else False
    require(ok, f"passwordless sudo for {os.environ.get('USER', os.getuid())} (./dev.sh "
                "test sets it up for hpct-alice), for the operator's steps")


def chown(path: os.PathLike[str] | str, uid: int, gid: int | None = None,
          follow: bool = True) -> None:
    """Hand ``path`` to ``uid`` (what only root may do)."""
    if is_root():
        (os.chown if follow else os.lchown)(path, uid, uid if gid is None else gid)
        return
    run(["chown", *([] if follow else ["-h"]), f"{uid}:{uid if gid is None else gid}",
         str(path)])


_CALL = """\
import pickle, sys
from hpctrain.devcluster.cluster import DevCluster
name, args, kwargs = pickle.loads(sys.stdin.buffer.read())
result = getattr(DevCluster(), name)(*args, **kwargs)
sys.stdout.buffer.write(pickle.dumps(result))
"""


class Cluster:
    """The devcluster, its operator methods run as root (a :class:`DevCluster` in a root
    child process when this one is not root); everything else is read here."""

    OPERATOR = {"up", "down", "stop_daemon", "start_daemon", "make_nodes_usable", "status",
                "slow_node", "restore_node"}

    def __init__(self) -> None:
        from hpctrain.devcluster.cluster import DevCluster

        self.local = DevCluster()

    def __getattr__(self, name: str) -> Any:
        if name not in self.OPERATOR or is_root():
            return getattr(self.local, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            res = subprocess.run(_sudo([sys.executable, "-c", _CALL]),
                                 input=pickle.dumps((name, args, kwargs)),
                                 capture_output=True, timeout=600)
            assert res.returncode == 0, f"DevCluster().{name}{args} as root failed:\n" \
                                        f"{res.stderr.decode(errors='replace')[-3000:]}"
            return pickle.loads(res.stdout)
        return call
