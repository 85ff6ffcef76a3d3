"""The Debian packages the devcluster needs: check, and install when we are root."""

from __future__ import annotations

import os
import shutil
import subprocess

from hpctrain.errors import DevclusterError

# runc: Slurm's OCI containers (`srun --container`); crun fails on this machine kind
PACKAGES = ("munge", "slurm-client", "slurmctld", "slurmd", "slurmdbd", "mariadb-server", "runc")
# binaries each package must provide, checked instead of asking dpkg (works off Debian too)
BINARIES = {
    "munge": "/usr/sbin/munged",
    "slurm-client": "/usr/bin/sbatch",
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
    "slurmdbd": "/usr/sbin/slurmdbd",
    "mariadb-server": "/usr/sbin/mariadbd",
    "runc": "/usr/sbin/runc",
    # `up --ssh` only: the --host tests' login node
    "openssh-server": "/usr/sbin/sshd",
    "openssh-client": "/usr/bin/ssh",
    "rsync": "/usr/bin/rsync",
}
APT_TIMEOUT_S = 900


def missing_packages(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Packages whose binaries are not on this machine."""
    return [pkg for pkg in packages if not os.path.exists(BINARIES[pkg])]


def ensure_packages(install: bool = True, extra: tuple[str, ...] = ()) -> list[str]:
    """Make sure every package (and ``extra``) is installed; returns what was installed.

    As root, missing packages are installed with apt-get; otherwise the error says
    exactly what to install.
    """
    wanted = PACKAGES + extra
    missing = missing_packages(wanted)
    if not missing:
        return []
    command = f"apt-get install -y {' '.join(missing)}"
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise DevclusterError(f"missing packages {', '.join(missing)}: as root run "
                              f"`apt-get update && {command}` (or run `hpctrain devcluster up` "
                              "as root on Debian, which installs them)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", *missing]):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=APT_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            raise DevclusterError(f"`{' '.join(argv)}` failed (exit {proc.returncode}):\n{tail}")
    still = missing_packages(wanted)
    if still:
        raise DevclusterError(f"apt-get reported success but {', '.join(still)} still missing")
    return missing
