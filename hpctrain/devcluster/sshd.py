"""The devcluster's SSH login (``hpctrain devcluster up --ssh``): a real OpenSSH server on
127.0.0.1, so ``hpctrain --host`` is tested through ssh, rsync and a login shell as they
are on a cluster's login node.

Keys only (no password is ever set or accepted), the allowed users only, loopback only.
Everything of the server's lives in ``<state dir>/ssh/`` (config, host key, pid file,
log, and the authorized keys: root-owned files, one per user). Each user gets, written
*by a process of that user* (root never follows a path in a user's home, where the user
could have planted a symlink): ``~/.ssh/hpctrain-devcluster`` (a key pair),
``~/.ssh/hpctrain-devcluster.known_hosts`` (this server's host key) and
``~/.ssh/hpctrain-devcluster.config`` (``Host hpctrain-devcluster``), included from
``~/.ssh/config`` when that file did not exist yet.

Users accumulate: ``up --ssh --ssh-user bob`` after ``--ssh-user alice`` allows both
(a user's key file in ``authorized_keys/`` is what marks her as set up).
"""

from __future__ import annotations

import os
import pwd
import re
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpctrain.devcluster import daemons, sshconf
from hpctrain.devcluster.sshconf import SSH_ALIAS
from hpctrain.errors import DevclusterError

SSHD = "/usr/sbin/sshd"
# what `up --ssh` needs beyond the cluster's packages (hpctrain.devcluster.packages)
SSH_PACKAGES = ("openssh-server", "openssh-client", "rsync")
KEY_NAME = SSH_ALIAS                    # ~/.ssh/hpctrain-devcluster(.pub, .config, ...)
PRIVSEP_DIR = Path("/run/sshd")         # sshd refuses to start without it (tmpfs: gone at boot)
_PUBLIC_KEY = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp\d+) ([A-Za-z0-9+/]+={0,2})")
_NO_PASSWORD_YET = ("!", "!!", "!*")    # useradd's and passwd -l's "never had a password"


# ---- where things are ------------------------------------------------------------------------
def ssh_dir(root: Path) -> Path:
    """The server's directory under the devcluster's state dir ``root``."""
    return root / "ssh"


def config_file(root: Path) -> Path:
    return ssh_dir(root) / "sshd_config"


def authorized_dir(root: Path) -> Path:
    """Root-owned, one 0644 file per user (sshd's ``AuthorizedKeysFile .../%u``)."""
    return ssh_dir(root) / "authorized_keys"


def daemon(root: Path) -> daemons.Daemon:
    """sshd as a devcluster daemon: it daemonizes and writes its PidFile; its process
    title ("sshd: /usr/sbin/sshd -f CONF [listener] ...") keeps the config's path, which
    is how its pid is trusted. ``-E``: its log in our log file, not a syslog that a
    container may not have."""
    conf = config_file(root)
    log = ssh_dir(root) / "sshd.log"
    return daemons.Daemon("sshd", (SSHD, "-f", str(conf), "-E", str(log)),
                          ssh_dir(root) / "sshd.pid", log, ("sshd", str(conf)))


def configured(root: Path) -> bool:
    """Was the SSH login set up (``up --ssh``) for this cluster? Then ``up`` keeps it
    running, ``status`` lists it and ``down`` stops it."""
    return config_file(root).is_file()


def settings(root: Path) -> dict[str, Any] | None:
    """Port, users, host alias and config file of a set-up SSH login (None when not)."""
    try:
        text = config_file(root).read_text()
    except OSError:
        return None
    return {**sshconf.sshd_settings(text), "alias": SSH_ALIAS, "config": str(config_file(root))}


# ---- up ----------------------------------------------------------------------------------------
def up(root: Path, port: int, users: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Start (or restart with new settings) the SSH server on ``port`` for ``users`` and
    every user set up before; set each one's files up. Returns what to tell the operator."""
    sshconf.check_ssh_settings(port, users)
    _check_port(root, port)
    d = ssh_dir(root)
    keys = authorized_dir(root)
    for path in (d, keys):
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o755)
    _check_strict_modes(keys)
    earlier = [p.name for p in keys.iterdir() if _exists(p.name)]
    allowed = sorted(set(users) | set(earlier))
    accounts = {name: _account(name) for name in allowed}
    host_key = d / "host_ed25519_key"
    if not host_key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", SSH_ALIAS,
              "-f", str(host_key)])
    changed = _write_config(root, port, allowed)
    notes: list[str] = []
    for name in allowed:
        notes += unlock_for_keys(name)
        notes += _set_up_user(accounts[name], port, keys,
                              host_key.with_suffix(".pub").read_text())
    sshd = daemon(root)
    if changed:
        daemons.stop(sshd)   # established sessions are children of their own: they stay
    start(root, env)
    return [f"sshd on 127.0.0.1:{port} for {', '.join(allowed)} (keys only; "
            f"config {config_file(root)}, log {sshd.log_file})", *notes]


def start(root: Path, env: Mapping[str, str]) -> int:
    """Start the configured server unless it runs (``up`` calls this for a cluster set up
    with ``--ssh`` before); its pid."""
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    os.chmod(PRIVSEP_DIR, 0o755)
    try:
        return daemons.start(daemon(root), env)
    except DevclusterError as exc:
        port = (settings(root) or {}).get("port")
        raise DevclusterError(f"{exc}\n(is port {port} taken by another program? `ss -ltnp` "
                              "says; pass another --ssh-port)") from None


def _check_port(root: Path, port: int) -> None:
    """Refuse a port another program listens on before the running server is stopped
    for it (our own server on it is fine: it is restarted in place)."""
    ours = settings(root) or {}
    if ours.get("port") == port and daemons.running_pid(daemon(root)) is not None:
        return
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise DevclusterError(f"--ssh-port {port}: 127.0.0.1:{port} is taken ({exc.strerror}"
                                  "; `ss -ltnp` names the program): pass another "
                                  "--ssh-port") from None


def _write_config(root: Path, port: int, users: Sequence[str]) -> bool:
    """Write sshd_config if it changed, checked by ``sshd -t`` first (a config sshd would
    refuse never replaces a working one). True when it changed."""
    text = sshconf.sshd_config(ssh_dir(root), port, users)
    conf = config_file(root)
    if conf.is_file() and conf.read_text() == text:
        return False
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)   # `sshd -t` checks it too
    new = conf.with_name(conf.name + ".new")
    new.write_text(text)
    _run([SSHD, "-t", "-f", str(new)])
    os.replace(new, conf)
    return True


def _check_strict_modes(path: Path) -> None:
    """sshd's StrictModes refuses every key whose file sits below a directory that is not
    root's or is writable by group or others (a --state-dir under /tmp): say so now."""
    for parent in [path, *path.parents]:
        st = os.stat(parent)
        if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise DevclusterError(
                f"{parent} is {'not owned by root' if st.st_uid else 'group/world-writable'}: "
                f"sshd (StrictModes) would refuse every key under {path}; use a --state-dir "
                "whose parents are root's and not writable by others (the default "
                "/var/lib/hpctrain/devcluster is)")


def _exists(name: str) -> bool:
    try:
        return pwd.getpwnam(name).pw_uid != 0
    except KeyError:
        return False


def _account(name: str) -> pwd.struct_passwd:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise DevclusterError(f"--ssh-user {name!r}: no such user (make it first: "
                              f"useradd --create-home {name})") from None
    if entry.pw_uid == 0:
        raise DevclusterError(f"--ssh-user {name!r} has uid 0: root may not log in; name "
                              "an ordinary user")
    return entry


def unlock_for_keys(name: str) -> list[str]:
    """Let ``name`` log in with a key although the server runs without PAM.

    Without PAM, OpenSSH refuses an account whose password field starts with "!"
    ("locked") even for a key. useradd leaves exactly "!" (no password ever set): that
    becomes "*" (no password either, but not locked), and the note says so. An account
    locked with a password behind the "!" was locked by somebody on purpose: refused."""
    found = subprocess.run(["getent", "shadow", name], capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
    fields = found.stdout.rstrip("\n").split(":")   # no shadow entry: nothing locks it
    password = fields[1] if found.returncode == 0 and len(fields) > 1 else ""
    if not password.startswith("!"):
        return []
    if password not in _NO_PASSWORD_YET:
        raise DevclusterError(f"--ssh-user {name}: the account is locked and has a password "
                              "(usermod -L): sshd would refuse it; unlock it "
                              f"(`usermod -U {name}`) or name another user")
    _run(["usermod", "-p", "*", name])
    return [f"{name}: password field was {password!r} (locked; what useradd leaves), now '*' "
            "(no password): sshd without PAM admits a locked account to no one, keys "
            "included"]


# every file is made by the user's own process, umask 077: nothing of root's follows a
# path in the home. $1 key path, $2 key comment, $3 known hosts, $4 the Host block.
_USER_SCRIPT = r"""
set -eu
umask 077
mkdir -p "$HOME/.ssh"
chmod 700 "$HOME/.ssh"
[ -f "$1" ] || ssh-keygen -q -t ed25519 -N '' -C "$2" -f "$1"
chmod 600 "$1"
[ -f "$1.pub" ] || ssh-keygen -y -f "$1" > "$1.pub"
chmod 644 "$1.pub"
printf '%s' "$3" > "$1.known_hosts.tmp" && mv -f "$1.known_hosts.tmp" "$1.known_hosts"
printf '%s' "$4" > "$1.config.tmp" && mv -f "$1.config.tmp" "$1.config"
include="Include $(basename "$1").config"
if [ ! -e "$HOME/.ssh/config" ]; then
  printf '%s\n' "$include" > "$HOME/.ssh/config"; echo "config: created"
elif grep -qsF "$include" "$HOME/.ssh/config"; then echo "config: included"
else echo "config: hint"; fi
echo "pub: $(head -n 1 "$1.pub")"
"""


def _set_up_user(entry: pwd.struct_passwd, port: int, keys: Path, host_key: str) -> list[str]:
    """The user's key pair, known hosts and Host block (written as the user), and her
    public key in the root-owned authorized-keys file; notes for the operator."""
    name, ssh = entry.pw_name, Path(entry.pw_dir) / ".ssh"
    key = ssh / KEY_NAME
    block = sshconf.ssh_client_config(port, name, str(key), f"{key}.known_hosts")
    out = _run(["sh", "-c", _USER_SCRIPT, "sh", str(key), f"{name}@{SSH_ALIAS}",
                sshconf.ssh_known_hosts(port, host_key), block], user=entry)
    found = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    public = _PUBLIC_KEY.match(found.get("pub", ""))
    if public is None:
        raise DevclusterError(f"{key}.pub of {name} is not an ssh public key: remove "
                              f"{key} and {key}.pub (as {name}) and run `up --ssh` again")
    authorized = keys / name
    tmp = authorized.with_name(f".{name}.new")
    # type and key only: nothing of the user's (options such as command=) reaches sshd
    tmp.write_text(f"{public.group(1)} {public.group(2)} {name}@{SSH_ALIAS}\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, authorized)
    notes = [f"{name}: `ssh {SSH_ALIAS}` / `hpctrain --host {SSH_ALIAS} ...` (key {key}, "
             f"host block {key}.config, known hosts {key}.known_hosts)"]
    if found.get("config") == "created":
        notes.append(f"{name}: created {ssh}/config with `Include {KEY_NAME}.config`")
    elif found.get("config") == "hint":
        notes.append(f"{name}: {ssh}/config does not include the host block: add "
                     f"`Include {KEY_NAME}.config` at its top (left unchanged)")
    return notes


def _run(argv: list[str], user: pwd.struct_passwd | None = None) -> str:
    """Run a setup helper, as root or (``user``) as that user in a clean environment."""
    kwargs: dict[str, Any] = {}
    if user is not None:
        kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [],
                  "env": {"HOME": user.pw_dir, "USER": user.pw_name, "PATH": "/usr/bin:/bin",
                          "LANG": "C.UTF-8"},
                  "cwd": "/"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, **kwargs)
    if proc.returncode != 0:
        who = f" as {user.pw_name} (home {user.pw_dir})" if user is not None else ""
        raise DevclusterError(f"`{' '.join(argv[:3])}`{who} failed (exit {proc.returncode}): "
                              f"{proc.stderr.strip()[-400:]}")
    return proc.stdout
