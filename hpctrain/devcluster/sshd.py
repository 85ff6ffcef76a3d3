"""The devcluster's SSH login (``hpctrain devcluster up --ssh``): a real OpenSSH server on
127.0.0.1, so ``hpctrain --host`` is tested through ssh, rsync and a login shell as they
are on a cluster's login node.

Keys only (no password is ever set or accepted), the listed users only, loopback only.
Each user gets, written *as that user* (root never follows a path in a user's home):
``~/.ssh/hpctrain-devcluster`` (a key pair), ``~/.ssh/hpctrain-devcluster.known_hosts``
(this server's host key) and ``~/.ssh/hpctrain-devcluster.config`` (``Host
hpctrain-devcluster``), included from ``~/.ssh/config`` when that file did not exist yet.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path
from typing import Sequence

from hpctrain.devcluster import config, daemons
from hpctrain.devcluster.config import SSH_ALIAS
from hpctrain.errors import DevclusterError

SSHD = "/usr/sbin/sshd"
KEY_NAME = "hpctrain-devcluster"


def ssh_dir(root: Path) -> Path:
    return root / "ssh"


def daemon(root: Path) -> daemons.Daemon:
    d = ssh_dir(root)
    conf = d / "sshd_config"
    # sshd daemonizes and writes PidFile; its process title keeps the -f path
    return daemons.Daemon("sshd", (SSHD, "-f", str(conf)), d / "sshd.pid", d / "sshd.log",
                          ("sshd", str(conf)))


def configured(root: Path) -> bool:
    """Was the SSH login set up (``up --ssh``) for this cluster?"""
    return (ssh_dir(root) / "sshd_config").is_file()


def up(root: Path, port: int, users: Sequence[str], env: dict[str, str]) -> list[str]:
    """Start (or restart with new settings) the SSH server for ``users``; what was done."""
    if not users:
        raise DevclusterError("`devcluster up --ssh` needs a user to log in as: pass "
                              "--ssh-user NAME (an ordinary user; root may not log in)")
    for name in users:
        _account(name)
    d = ssh_dir(root)
    (d / "authorized_keys").mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(d, 0o755)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)   # sshd's privilege-separation dir
    host_key = d / "host_ed25519_key"
    if not host_key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hpctrain-devcluster",
              "-f", str(host_key)])
    text = config.sshd_config(d, port, users)
    conf = d / "sshd_config"
    changed = not conf.is_file() or conf.read_text() != text
    conf.write_text(text)
    _run([SSHD, "-t", "-f", str(conf)])                  # a bad config fails here, named
    notes = [_user(name, port, d, host_key.with_suffix(".pub").read_text().split()[:2])
             for name in users]
    sshd = daemon(root)
    if changed:
        daemons.stop(sshd)
    daemons.start(sshd, env)
    return notes


def _account(name: str) -> pwd.struct_passwd:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise DevclusterError(f"--ssh-user {name!r}: no such user (useradd it first)") from None
    if entry.pw_uid == 0:
        raise DevclusterError("--ssh-user root: root may not log in; name an ordinary user")
    # Without PAM, OpenSSH refuses an account whose password is locked ("!" in shadow, what
    # useradd leaves) even for a key; "*" means "no password" and lets keys in.
    shadow = _run(["getent", "shadow", name]).split(":")
    if len(shadow) > 1 and shadow[1].startswith("!"):
        _run(["usermod", "-p", "*", name])
    return entry


def _user(name: str, port: int, d: Path, host_key: list[str]) -> str:
    """The user's key pair, known hosts and ssh config (written as the user); a note."""
    entry = _account(name)
    ssh = Path(entry.pw_dir) / ".ssh"
    key = ssh / KEY_NAME
    known = ssh / f"{KEY_NAME}.known_hosts"
    block = config.ssh_client_config(port, name, str(key), str(known))
    known_text = "".join(f"{h} {' '.join(host_key)}\n"
                         for h in (f"[127.0.0.1]:{port}", f"[{SSH_ALIAS}]:{port}"))
    # every file below is made by the user's own process: umask 077, no symlink followed
    script = r"""
set -eu
umask 077
mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh"
[ -f "$1" ] || ssh-keygen -q -t ed25519 -N '' -C "$2" -f "$1"
printf '%s' "$3" > "$1.known_hosts.tmp" && mv -f "$1.known_hosts.tmp" "$1.known_hosts"
printf '%s' "$4" > "$1.config.tmp" && mv -f "$1.config.tmp" "$1.config"
if [ ! -e "$HOME/.ssh/config" ]; then
  printf 'Include %s\n' "$(basename "$1").config" > "$HOME/.ssh/config"; echo created
elif ! grep -q "$(basename "$1").config" "$HOME/.ssh/config"; then echo hint; fi
cat "$1.pub"
"""
    out = _run(["sh", "-c", script, "sh", str(key), f"{name}@hpctrain-devcluster",
                known_text, block], user=entry).splitlines()
    authorized = d / "authorized_keys" / name
    authorized.write_text(out[-1] + "\n")
    os.chmod(authorized, 0o644)
    note = f"ssh login for {name}: `ssh {SSH_ALIAS}` / `hpctrain --host {SSH_ALIAS} ...`"
    if "hint" in out:
        note += (f" (add `Include {KEY_NAME}.config` at the top of ~{name}/.ssh/config, "
                 "or pass --ssh-config)")
    return note


def _run(argv: list[str], user: pwd.struct_passwd | None = None) -> str:
    kwargs = {}
    if user is not None:
        kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [],
                  "env": {"HOME": user.pw_dir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                  "cwd": "/"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, **kwargs)
    if proc.returncode != 0:
        raise DevclusterError(f"`{' '.join(argv[:3])}` failed (exit {proc.returncode}): "
                              f"{proc.stderr.strip()[-400:]}")
    return proc.stdout
