"""Start and stop daemons by pid file, and only the ones whose pid file we own.

A pid is trusted only while /proc/<pid>/cmdline still names the expected program, so a
recycled pid never gets a signal from us.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from hpctrain.errors import DevclusterError


@dataclass(frozen=True)
class Daemon:
    """One daemon: how to start it and how to recognise it."""

    name: str                   # e.g. "slurmd-n1"; also names its pid and log files
    argv: tuple[str, ...]
    pid_file: Path
    log_file: Path
    match: tuple[str, ...]      # words its /proc cmdline must contain
    forks: bool = True          # daemonizes itself (writes pid file); else we background it


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    # a daemon that rewrote its title into one word with spaces (sshd: "sshd: /usr/sbin/sshd
    # -f CONF [listener] ...") keeps it whole
    return [os.path.basename(w) if i == 0 and " " not in w else w
            for i, w in enumerate(raw.decode(errors="replace").split("\0")) if w]


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def running_pid(daemon: Daemon) -> int | None:
    """The daemon's pid if its pid file names a live process that is really it.

    A pid file this user may not read (MariaDB's is 0660 mysql: `devcluster status` as
    an ordinary user) is replaced by a look through /proc for the daemon's command line."""
    if not os.access(daemon.pid_file, os.R_OK) and daemon.pid_file.exists():
        found = [int(p) for p in os.listdir("/proc") if p.isdigit() and _is(int(p), daemon)]
        return found[0] if len(found) == 1 else None
    pid = read_pid(daemon.pid_file)
    if pid is None or not _is(pid, daemon):
        return None
    return pid


def _is(pid: int, daemon: Daemon) -> bool:
    if _is_zombie(pid):
        return False
    words = _cmdline(pid)
    joined = " ".join(words)
    return bool(words) and all(m in joined for m in daemon.match)


def start(daemon: Daemon, env: Mapping[str, str], timeout_s: float = 30.0) -> int:
    """Start ``daemon`` unless it already runs; return its pid once its pid file is live."""
    pid = running_pid(daemon)
    if pid is not None:
        return pid
    daemon.pid_file.unlink(missing_ok=True)
    daemon.log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(daemon.log_file, "ab") as log:
        proc = subprocess.Popen(daemon.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=dict(env), start_new_session=True, close_fds=True)
    if daemon.forks:
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        if code not in (0, None):
            raise DevclusterError(f"{daemon.name} failed to start (exit {code}); "
                                  f"see {daemon.log_file}:\n{_tail(daemon.log_file)}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = running_pid(daemon)
        if pid is not None:
            return pid
        if not daemon.forks and proc.poll() is not None:
            break
        time.sleep(0.1)
    raise DevclusterError(f"{daemon.name} did not come up within {timeout_s:g}s; "
                          f"see {daemon.log_file}:\n{_tail(daemon.log_file)}")


def stop(daemon: Daemon, timeout_s: float = 20.0) -> bool:
    """Stop ``daemon`` if it runs from our pid file: TERM, then KILL. True if it was running."""
    pid = running_pid(daemon)
    if pid is None:
        daemon.pid_file.unlink(missing_ok=True)
        return False
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and running_pid(daemon) == pid:
            time.sleep(0.1)
        if running_pid(daemon) != pid:
            break
    else:
        raise DevclusterError(f"{daemon.name} (pid {pid}) did not stop after SIGKILL")
    daemon.pid_file.unlink(missing_ok=True)
    return True


def run_checked(argv: Sequence[str], env: Mapping[str, str] | None = None,
                timeout_s: float = 120.0, input: str | None = None) -> str:
    """Run a setup helper (mariadb-install-db, mariadb client, mungekey); raise with its output."""
    try:
        proc = subprocess.run(list(argv), env=None if env is None else dict(env), input=input,
                              capture_output=True, text=True, timeout=timeout_s,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise DevclusterError(f"`{' '.join(argv)}` timed out after {timeout_s:g}s") from None
    if proc.returncode != 0:
        raise DevclusterError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): "
                              f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc.stdout


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
