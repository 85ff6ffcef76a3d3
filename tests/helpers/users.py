"""Ordinary users for the shared-cluster tests: made with Debian's ``useradd`` (homes
0700, as a site sets them) and driven with ``runuser``, so every permission check is the
kernel's and Slurm's own, not root's pass-everything.

``alice`` is the user under test, ``bob`` her neighbour. Both run the project's venv
Python, which therefore must be one every user may execute (dev.sh makes it from Debian's
/usr/bin/python3, not from a Python under /root).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from helpers import admin

ALICE, BOB = "hpct-alice", "hpct-bob"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    home: Path

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A clean login-like environment: this user's HOME, the venv first on PATH."""
        venv_bin = str(Path(sys.executable).parent)
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
                "PATH": f"{venv_bin}:/usr/bin:/bin", "LANG": "C.UTF-8",
                "SLURM_CONF": os.environ.get("SLURM_CONF", ""), **(extra or {})}

    def run(self, argv: Sequence[str], *, cwd: Path | None = None,
            env: Mapping[str, str] | None = None, timeout: float = 120,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as this user in ``cwd`` (default: the home), the environment cleared
        but for :meth:`env`: directly when the tests run as this user, else through
        ``runuser`` (root) or ``sudo -u`` (the test user acting as the neighbour)."""
        words = [f"{k}={v}" for k, v in self.env(env).items()]
        # cd as the user: the caller may not enter the user's home
        inner = ["env", "-i", *words, "sh", "-c", 'cd -- "$1" && shift && exec "$@"', "sh",
                 str(cwd or self.home), *argv]
        if os.geteuid() == self.uid:
            prefix: list[str] = []
        elif os.geteuid() == 0:
            prefix = ["runuser", "-u", self.name, "--"]
        else:
            prefix = ["sudo", "-n", "-u", self.name]
        res = subprocess.run([*prefix, *inner], capture_output=True, text=True,
                             timeout=timeout)
        if check:
            assert res.returncode == 0, f"{self.name}: {argv} -> {res.returncode}\n{res.stderr}"
        return res

    def hpctrain(self, *args: str, **kw) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-m", "hpctrain", *args], **kw)

    def python(self, code: str, **kw) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-c", code], **kw)


def ensure(name: str) -> User:
    """The ordinary user ``name``, made if missing (home 0700, login shell bash; no
    password, so only root can become it)."""
    admin.require_sudo()
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        admin.run(["useradd", "--create-home", "--shell", "/bin/bash", name])
        entry = pwd.getpwnam(name)
    home = Path(entry.pw_dir)
    admin.run(["chmod", "700", str(home)])
    _register(name)
    user = User(name, entry.pw_uid, home)
    probe = user.python("import hpctrain")
    assert probe.returncode == 0, (
        f"{name} cannot run {sys.executable} ({probe.stderr.strip()[-300:]}): the venv "
        "must be made from a Python every user may execute (./dev.sh install does)")
    return user


def _register(name: str) -> None:
    """Add the user to the devcluster's accounting, as a site's admins add every user: under
    PrivateData=jobs slurmdbd shows nothing, not even their own jobs, to a user it does not
    know (`devcluster up` registers the login accounts that exist when it runs)."""
    from hpctrain.devcluster.config import ACCOUNT, CLUSTER_NAME

    known = admin.run(["sacctmgr", "-n", "-P", "list", "user", name, "format=User"],
                      check=False).stdout.split()
    if name not in known:
        admin.run(["sacctmgr", "-i", "add", "user", name, f"account={ACCOUNT}",
                   f"cluster={CLUSTER_NAME}"])
