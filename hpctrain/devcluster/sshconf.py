"""Pure rendering of the SSH login of ``devcluster up --ssh`` (hpctrain.devcluster.sshd):
sshd's config, the users' client config and known hosts, and the checks on port and users.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from hpctrain.errors import DevclusterError

SSH_PORT = 2222
SSH_ALIAS = "hpctrain-devcluster"
# what useradd and shadow-utils accept, and nothing sshd_config would read as two words
_USER_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?")


def check_ssh_settings(port: int, users: Sequence[str]) -> None:
    """Refuse a port or user list the SSH server cannot take, naming the value and the fix."""
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise DevclusterError(f"--ssh-port {port!r} is not a TCP port: use 1..65535 "
                              f"(default {SSH_PORT})")
    if not users:
        raise DevclusterError("`devcluster up --ssh` needs a user to log in as: pass "
                              "--ssh-user NAME (an ordinary user; root may not log in)")
    for name in users:
        if name == "root":
            raise DevclusterError("--ssh-user root: root may not log in (PermitRootLogin "
                                  "no); name an ordinary user")
        if not _USER_NAME.fullmatch(name):
            raise DevclusterError(f"--ssh-user {name!r} is not a user name sshd can allow: "
                                  "use the account's login name (lower case, digits, _.-)")


def sshd_config(ssh_dir: Path, port: int, users: Sequence[str]) -> str:
    """sshd_config of the devcluster's SSH server: loopback only, keys only, the listed
    users only (never root), their keys in root-owned files under ``ssh_dir``. Pure;
    raises DevclusterError for a bad port or user (:func:`check_ssh_settings`)."""
    check_ssh_settings(port, users)
    return "\n".join([
        "# Written by `hpctrain devcluster up --ssh`: the devcluster's login node, for",
        "# `hpctrain --host`. Rewritten by every `up --ssh`; do not edit.",
        f"Port {port}",
        # a shared machine must not offer this login to the network
        "ListenAddress 127.0.0.1",
        f"HostKey {ssh_dir}/host_ed25519_key",
        f"PidFile {ssh_dir}/sshd.pid",
        # root-owned files (0644): a user cannot add keys for herself or anybody else
        f"AuthorizedKeysFile {ssh_dir}/authorized_keys/%u",
        "AuthenticationMethods publickey", "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no", "PermitEmptyPasswords no", "PermitRootLogin no",
        # UsePAM no: the login must not depend on the host's PAM stack. On the development
        # machine (a container with CAP_AUDIT_CONTROL) Debian's /etc/pam.d/sshd works, but
        # where that capability is missing its `session required pam_loginuid.so` fails
        # every login, and pam_nologin refuses all while /run/nologin exists. The price:
        # without PAM, sshd refuses a "locked" account ("!" in /etc/shadow, what useradd
        # leaves) even for a key, so `up --ssh` gives such an --ssh-user "*" (no password;
        # hpctrain.devcluster.sshd.unlock_for_keys).
        "UsePAM no",
        f"AllowUsers {' '.join(users)}",
        "StrictModes yes", "PermitUserEnvironment no",
        # local forwarding only, as most login nodes allow it (Jupyter tunnels): the client
        # reaches its warm server through a forwarded unix socket, and OpenSSH refuses even
        # those under AllowTcpForwarding no (hpctrain.remote.warm then falls back to plain
        # ssh); -R (a listener on the cluster) stays off
        "X11Forwarding no", "AllowTcpForwarding local", "AllowStreamLocalForwarding local",
        "AllowAgentForwarding no",
        "PrintMotd no",
        # one login per test worker, each multiplexing many sessions (ControlMaster)
        "MaxSessions 64", "MaxStartups 64:30:128",
        "Subsystem sftp internal-sftp", ""])


def sshd_settings(text: str) -> dict[str, object]:
    """The port and users of a config :func:`sshd_config` wrote (for ``status``). Pure."""
    found: dict[str, object] = {"port": None, "users": []}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "Port" and value.strip().isdigit():
            found["port"] = int(value)
        elif key == "AllowUsers":
            found["users"] = value.split()
    return found


def ssh_client_config(port: int, user: str, key: str, known_hosts: str) -> str:
    """The user's ``Host hpctrain-devcluster`` block. Pure."""
    return "\n".join([
        "# Written by `hpctrain devcluster up --ssh`; rewritten by every `up --ssh`.",
        f"Host {SSH_ALIAS}",
        "  HostName 127.0.0.1", f"  Port {port}", f"  User {user}", f"  IdentityFile {key}",
        "  IdentitiesOnly yes", f"  UserKnownHostsFile {known_hosts}",
        "  StrictHostKeyChecking yes", "  BatchMode yes", ""])


def ssh_known_hosts(port: int, host_key: str) -> str:
    """The user's known-hosts file: the server's key (``ssh-ed25519 AAAA...``) under the
    address ssh looks up (``[127.0.0.1]:PORT``) and under the alias. Pure."""
    key = " ".join(host_key.split()[:2])   # no comment
    return "".join(f"[{host}]:{port} {key}\n" for host in ("127.0.0.1", SSH_ALIAS))
