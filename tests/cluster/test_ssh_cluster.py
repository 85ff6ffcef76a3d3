"""The devcluster's SSH login (``hpctrain devcluster up --ssh``), as the ordinary user
alice reaches it: a real OpenSSH server on 127.0.0.1 only, her own key, her ~/.ssh/config,
multiplexed connections and rsync, as ``hpctrain --host`` uses them; root and passwords
refused. The operator's ``up --ssh`` goes through :func:`helpers.ssh.ensure_ssh`.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import uuid
from pathlib import Path

import pytest

from helpers import admin, users
from helpers.net import listening
from helpers.ssh import PORT, ensure_ssh

# alone: the SSH login is the machine's (one port, one alias in each user's ~/.ssh/config)
pytestmark = [pytest.mark.slurm, pytest.mark.alone]
STATE = Path(os.environ.get("HPCTRAIN_DEVCLUSTER_DIR", "/var/lib/hpctrain/devcluster"))


@pytest.fixture(scope="session")
def alias(cluster) -> str:
    users.ensure(users.ALICE)
    return ensure_ssh(users.ALICE)


@pytest.fixture(scope="module")
def alice(alias: str) -> users.User:
    return users.ensure(users.ALICE)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_alice_logs_in_with_her_key_as_herself(alias: str, alice: users.User) -> None:
    res = alice.run(["ssh", alias, "--", "id", "-un"], timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == users.ALICE


def test_a_second_ssh_reuses_the_master_connection(alias: str, alice: users.User) -> None:
    control = alice.home / ".ssh" / f"cm-{uuid.uuid4().hex[:8]}"   # short: a socket path
    mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={control}",
           "-o", "ControlPersist=60"]
    try:
        first = alice.run(["ssh", *mux, alias, "--", "true"], timeout=30)
        assert first.returncode == 0, first.stderr
        check = alice.run(["ssh", "-o", f"ControlPath={control}", "-O", "check", alias])
        master = re.search(r"Master running \(pid=(\d+)\)", check.stderr)
        assert check.returncode == 0 and master, check.stderr
        second = alice.run(["ssh", "-v", *mux, alias, "--", "id", "-un"], timeout=30)
        assert second.returncode == 0 and second.stdout.strip() == users.ALICE, second.stderr
        # through the master: no second key exchange, no second authentication
        assert "auto-mux: Trying existing master" in second.stderr
        assert "Authenticated to" not in second.stderr, second.stderr[-2000:]
        again = alice.run(["ssh", "-o", f"ControlPath={control}", "-O", "check", alias])
        assert f"pid={master.group(1)})" in again.stderr
    finally:
        alice.run(["ssh", "-o", f"ControlPath={control}", "-O", "exit", alias])


def test_root_is_refused_and_no_password_is_asked(alias: str, alice: users.User) -> None:
    key = alice.home / ".ssh" / alias
    # alice offers her own (authorized) key, and knows the host key: still refused
    res = alice.run(["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={key}.known_hosts",
                     "-o", "StrictHostKeyChecking=yes", "-i", str(key), "-o",
                     "IdentitiesOnly=yes", "-p", str(PORT), "root@127.0.0.1", "true"],
                    timeout=30)
    assert res.returncode == 255, (res.stdout, res.stderr)
    # the server offers public keys and nothing else (no password, no keyboard-interactive)
    assert "root@127.0.0.1: Permission denied (publickey)." in res.stderr, res.stderr
    log = (STATE / "ssh" / "sshd.log").read_text(errors="replace")
    assert "User root from 127.0.0.1 not allowed" in log


def test_sshd_listens_on_loopback_only(alias: str) -> None:
    assert listening(PORT) == {"127.0.0.1"}


def test_alices_files_are_hers_and_private_her_key_is_roots_to_change(
        alias: str, alice: users.User) -> None:
    ssh = alice.home / ".ssh"
    assert os.stat(ssh).st_uid == alice.uid and _mode(ssh) == 0o700
    assert {p.name: _mode(p) for p in ssh.glob(f"{alias}*")} == {
        alias: 0o600, f"{alias}.pub": 0o644, f"{alias}.config": 0o600,
        f"{alias}.known_hosts": 0o600}
    assert re.search(rf"(?m)^\[127\.0\.0\.1\]:{PORT} ssh-ed25519 ",
                     (ssh / f"{alias}.known_hosts").read_text())
    block = (ssh / f"{alias}.config").read_text()
    assert f"Host {alias}\n" in block and f"  User {users.ALICE}\n" in block
    assert f"Include {alias}.config" in (ssh / "config").read_text()
    authorized = STATE / "ssh" / "authorized_keys" / users.ALICE
    st = os.stat(authorized)
    assert (st.st_uid, _mode(authorized)) == (0, 0o644)
    assert authorized.read_text().split()[:2] == (ssh / f"{alias}.pub").read_text().split()[:2]
    # she cannot add a key of her own choosing: neither the file nor its directory is hers
    assert alice.run(["sh", "-c", f'echo x >> "{authorized}"']).returncode != 0
    assert alice.run(["touch", str(authorized.parent / "planted")]).returncode != 0


def test_rsync_over_the_login(alias: str, alice: users.User) -> None:
    tag = uuid.uuid4().hex[:8]
    src, dst = alice.home / f"rsync-src-{tag}", alice.home / f"rsync-dst-{tag}"
    alice.run(["sh", "-c", f'mkdir -p "{src}/sub" && echo hello > "{src}/sub/f"'], check=True)
    res = alice.run(["rsync", "-a", "-e", "ssh", f"{src}/", f"{alias}:{dst}/"], timeout=60)
    assert res.returncode == 0, res.stderr
    assert alice.run(["cat", str(dst / "sub" / "f")], check=True).stdout == "hello\n"
    alice.run(["rm", "-rf", str(src), str(dst)], check=True)


def test_up_ssh_again_keeps_the_server_and_status_shows_it(alias: str,
                                                            alice: users.User) -> None:
    def sshd_row() -> tuple[dict, dict]:
        res = alice.hpctrain("devcluster", "status", "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        info = json.loads(res.stdout)
        return [d for d in info["daemons"] if d["name"] == "sshd"][0], info["ssh"]

    before, settings = sshd_row()
    assert before["alive"] and settings["port"] == PORT and users.ALICE in settings["users"]
    again = admin.run([sys.executable, "-m", "hpctrain", "devcluster", "up", "--ssh",
                       "--ssh-user", users.ALICE])
    assert f"{users.ALICE}: `ssh {alias}` / `hpctrain --host {alias} ...`" in again.stdout
    assert "already up" in again.stdout
    assert sshd_row()[0]["pid"] == before["pid"]   # nothing changed: not restarted
    text = alice.hpctrain("devcluster", "status")
    assert f"ssh:       127.0.0.1:{PORT} (`ssh {alias}`)" in text.stdout, text.stdout
