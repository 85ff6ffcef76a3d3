"""The one module that runs ``ssh`` and ``rsync`` (argv lists, timeouts, typed errors).

The user's own OpenSSH does the work: their ``~/.ssh/config`` (host aliases, ProxyJump,
keys), their agent, their ``known_hosts``. hpctrain adds only:

- one multiplexed connection per host (ControlMaster, a socket in a 0700 directory of
  the user's), kept ``persist_s`` after its last use, so every later command of a
  session, and of the next CLI call, costs one round trip and no new handshake;
- ``BatchMode=yes``: no password or passphrase prompt ever waits in a notebook (hpctrain
  never asks for, nor stores, a password: keys and the agent authenticate);
- every remote word quoted for the remote shell (ssh joins its arguments into one command
  line; an unquoted user value would be shell code there);
- a forwarded unix socket to the cluster's warm server (:mod:`hpctrain.remote.warm`), which
  answers the short commands without a Python start there.

Failures become :class:`~hpctrain.errors.RemoteError` naming the host, what failed
(resolving, connecting, authentication, host key, hpctrain missing, version skew) and
the fix.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Sequence

from hpctrain import __version__, protocol
from hpctrain.errors import RemoteError
from hpctrain.remote.controldir import control_dir
from hpctrain.remote.warm import WarmPath, relay

REMOTE_COMMAND_ENV = protocol.REMOTE_COMMAND
SSH_EXIT = 255              # ssh's own failure (the remote command's codes pass through)
CONNECT_TIMEOUT_S = 15
RUN_TIMEOUT_S = 300.0
_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Target:
    """Where ``--host`` points: ``[user@]host[:port]``; ``host`` may be an alias of the
    user's ssh config."""

    host: str
    user: str = ""
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> "Target":
        """Parse ``[user@]host[:port]`` (``[v6-address]:port`` too); RemoteError naming the
        value otherwise. Pure."""
        user, _, rest = text.rpartition("@")
        host, port = rest, None
        if rest.startswith("["):
            host, _, tail = rest[1:].partition("]")
            if tail and not tail.startswith(":"):
                host = ""
            port_text = tail[1:] if tail else ""
        else:
            host, _, port_text = rest.partition(":")
        if port_text:
            port = int(port_text) if port_text.isdigit() else 0
        ok_host = bool(host) and (_HOST.match(host) or (rest.startswith("[") and
                                                        re.match(r"^[0-9A-Fa-f:.]+$", host)))
        bad_user = "@" in text and not _USER.match(user)
        if not ok_host or bad_user or port == 0 or (port or 0) > 65535:
            raise RemoteError(f"--host {text!r} is not [user@]host[:port]: use a host name "
                              "or an alias of your ~/.ssh/config, e.g. --host login1 or "
                              "--host alice@cluster.example.org:2222")
        return cls(host, user, port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        dest = f"{self.user}@{host}" if self.user else host
        return f"{dest}:{self.port}" if self.port else dest

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host


def quote_word(word: str) -> str:
    """One word for the remote shell: quoted, except a leading ``~/`` (so a remote command
    such as ``~/venv/bin/hpctrain`` means the remote home). Pure."""
    if word.startswith("~/"):
        return "~/" + shlex.quote(word[2:])
    return shlex.quote(word)


def remote_line(words: Sequence[str]) -> str:
    """The command line ssh sends: every word quoted for the remote shell. Pure."""
    return " ".join(quote_word(w) for w in words)


def classify(target: Target, returncode: int, stderr: str, remote_command: Sequence[str]
             ) -> RemoteError | None:
    """What went wrong, from ssh's exit code and messages; None when the remote command
    itself ran (its exit code and messages are its own). Pure."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else "no message"
    if returncode == 127 and ("not found" in text or "No such file" in text):
        cmd = " ".join(remote_command)
        return RemoteError(f"hpctrain is not installed on {target} (`{cmd}`: command not "
                           f"found there): install it on the cluster (pip install "
                           f"hpctrain=={__version__}) or point --remote-command / "
                           f"{REMOTE_COMMAND_ENV} at it, e.g. ~/venv/bin/hpctrain")
    if "No such option: --client-version" in text:
        return RemoteError(f"hpctrain on {target} is older than this client "
                           f"({__version__}, which needs 0.5 or newer there): version skew; "
                           f"install hpctrain=={__version__} on the cluster")
    if returncode != SSH_EXIT:
        return None
    if "Host key verification failed" in text or "IDENTIFICATION HAS CHANGED" in text:
        return RemoteError(f"ssh to {target}: host key verification failed (the host's key "
                           "is not in your known_hosts, or it changed): check the key with "
                           f"your admins, then run `ssh {target.destination}` once to accept "
                           f"it (`ssh-keygen -R {target.host}` first if it changed)")
    if "Permission denied" in text or "Too many authentication failures" in text:
        return RemoteError(f"ssh to {target}: authentication failed ({last}): load your key "
                           f"into the agent (ssh-add) or set IdentityFile for {target.host} "
                           "in ~/.ssh/config; hpctrain never asks for a password "
                           "(BatchMode=yes)")
    if "Could not resolve hostname" in text:
        return RemoteError(f"cannot resolve {target.host}: check the name, or add a Host "
                           f"entry for it to ~/.ssh/config ({last})")
    if any(s in text for s in ("Connection refused", "timed out", "No route to host",
                               "Network is unreachable", "Connection closed",
                               "Connection reset")):
        return RemoteError(f"cannot connect to {target}: {last} (is the host up, the port "
                           "right, and are you on its network or VPN?)")
    return RemoteError(f"ssh to {target} failed (exit {returncode}): {last}")


class Connection:
    """ssh and rsync to one host over one multiplexed connection.

    ``remote_command`` starts hpctrain there (default ``$HPCTRAIN_REMOTE_COMMAND`` or
    ``hpctrain``); ``ssh_config`` replaces ~/.ssh/config (``ssh -F``) when given."""

    def __init__(self, target: Target | str, *, remote_command: Sequence[str] | str | None = None,
                 ssh_config: str | None = None, persist_s: int = 600) -> None:
        self.target = target if isinstance(target, Target) else Target.parse(target)
        if remote_command is None:
            remote_command = os.environ.get(REMOTE_COMMAND_ENV) or "hpctrain"
        if isinstance(remote_command, str):
            remote_command = shlex.split(remote_command)
        self.remote_command = list(remote_command)
        self.ssh_config = ssh_config
        self.persist_s = persist_s
        self.last_returncode = 0
        self._warm: WarmPath | None = None
        for tool in ("ssh", "rsync"):
            if shutil.which(tool) is None:
                raise RemoteError(f"--host needs OpenSSH's `{tool}` on this machine: install "
                                  "it (Debian: apt-get install openssh-client rsync; macOS "
                                  "has both)")

    # ---- argv ------------------------------------------------------------------------------
    def ssh_options(self) -> list[str]:
        """The options of every ssh this connection runs (rsync's too)."""
        opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                "-o", "ServerAliveInterval=30", "-o", "ControlMaster=auto",
                "-o", f"ControlPath={control_dir()}/%C",
                "-o", f"ControlPersist={self.persist_s}"]
        if self.ssh_config:
            opts = ["-F", self.ssh_config, *opts]
        if self.target.port:
            opts += ["-p", str(self.target.port)]
        return opts

    def ssh_argv(self, words: Sequence[str]) -> list[str]:
        """ssh running ``words`` on the host (quoted for its shell)."""
        return ["ssh", *self.ssh_options(), "--", self.target.destination, remote_line(words)]

    def hpctrain_words(self, args: Sequence[str]) -> list[str]:
        """The remote hpctrain command: unbuffered (``logs --follow`` streams), told this
        client's version (the cluster refuses a skewed one with the fix)."""
        return ["env", "PYTHONUNBUFFERED=1", *self.remote_command,
                "--client-version", __version__, *args]

    # ---- running -----------------------------------------------------------------------------
    def run(self, words: Sequence[str], *, input: bytes | None = None,
            timeout: float | None = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[bytes]:
        """Run ``words`` there and capture the output; RemoteError when ssh (not the remote
        command) failed, or the host does not answer within ``timeout``."""
        try:
            proc = subprocess.run(self.ssh_argv(words), input=input, capture_output=True,
                                  timeout=timeout,
                                  stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"{self.target} did not answer within {timeout:g} s "
                              f"(running {words[0]!r} there)") from None
        self._check(proc.returncode, proc.stderr.decode("utf-8", "replace"))
        return proc

    def hpctrain(self, args: Sequence[str], *, input: bytes | None = None,
                 timeout: float | None = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[bytes]:
        """Run hpctrain there with ``args`` and capture its output; its own failures keep
        their exit code. A short command goes to the warm server when there is one."""
        if input is None:
            out, err = bytearray(), bytearray()
            code = self.warm.run(args, out.extend, err.extend, timeout_s=timeout)
            if code is not None:
                return subprocess.CompletedProcess(args, code, bytes(out), bytes(err))
        return self.run(self.hpctrain_words(args), input=input, timeout=timeout)

    def hpctrain_stream(self, args: Sequence[str], *, input: bytes | None = None) -> int:
        """Run hpctrain there with ``args``, its output relayed to ours as it comes; its exit
        code. A short command goes to the warm server when there is one."""
        if input is None:
            import sys

            # no timeout, as over ssh (a long report); a dead link ends the ssh master,
            # which closes the forwarded socket
            code = self.warm.run(args, relay(sys.stdout), relay(sys.stderr), timeout_s=None)
            if code is not None:
                return code
        return self.stream(self.hpctrain_words(args), input=input)

    @property
    def warm(self) -> WarmPath:
        """This connection's warm server (:mod:`hpctrain.remote.warm`)."""
        if self._warm is None:
            self._warm = WarmPath(self)
        return self._warm

    def forward_socket(self, local: Path, remote: str) -> bool:
        """Have the shared connection forward unix socket ``local`` here to ``remote`` there
        (the warm server's); False when that cannot be (ssh's -L takes no ':' in paths)."""
        if ":" in str(local) or ":" in remote:
            return False
        base = ["ssh", *self.ssh_options()]
        spec = ["-L", f"{local}:{remote}", self.target.destination]
        # an earlier forward of ours would keep the name without a listener behind it
        subprocess.run([*base, "-O", "cancel", *spec], capture_output=True, timeout=30,
                       stdin=subprocess.DEVNULL)
        local.unlink(missing_ok=True)
        proc = subprocess.run([*base, "-O", "forward", *spec], capture_output=True,
                              timeout=30, stdin=subprocess.DEVNULL)
        return proc.returncode == 0

    def lines(self, words: Sequence[str], timeout_s: float | None = None,
              input: bytes | None = None, stderr: IO[str] | None = None) -> Iterator[str]:
        """The output lines of ``words`` run there, as they come (``logs --follow``, ``wait``);
        the remote command's messages are relayed to ``stderr`` (None: dropped). Ends with
        the command, or after ``timeout_s``. ssh's own failure raises RemoteError."""
        proc = subprocess.Popen(self.ssh_argv(words), stdin=subprocess.PIPE if input else
                                subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1)
        tail: list[str] = []

        def relay_err() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                tail.append(line)
                del tail[:-20]
                if stderr is not None and not line.startswith(("ssh:", "kex_", "Host key",
                                                               "@@@")):
                    stderr.write(line)
                    stderr.flush()

        threads = [threading.Thread(target=relay_err, daemon=True)]
        if timeout_s is not None:
            timer = threading.Timer(timeout_s, proc.terminate)
            timer.daemon = True
            threads.append(timer)
        for t in threads:
            t.start()
        if input:
            assert proc.stdin is not None
            proc.stdin.write(input.decode())
            proc.stdin.close()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                yield line.rstrip("\n")
        finally:
            if proc.poll() is None:
                proc.terminate()     # the caller stopped reading (Ctrl-C, a break)
            code = proc.wait()
            if timeout_s is not None:
                threads[1].cancel()  # type: ignore[attr-defined]
            threads[0].join(timeout=5)
        if code != -15:
            self._check(code, "".join(tail))
        self.last_returncode = code

    def stream(self, words: Sequence[str], *, input: bytes | None = None) -> int:
        """Run ``words`` there with stdout and stderr relayed to ours as they come; the
        remote exit code. ssh's own failure raises RemoteError."""
        import sys

        for line in self.lines(words, input=input, stderr=sys.stderr):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        return self.last_returncode

    def _check(self, returncode: int, stderr: str) -> None:
        error = classify(self.target, returncode, stderr, self.remote_command)
        if error is not None:
            raise error

    # ---- files -------------------------------------------------------------------------------
    def rsync(self, root: str, files: Sequence[str], dest: str,
              timeout: float | None = 3600) -> None:
        """Copy ``files`` (paths below ``root``) to ``dest`` on the host (a path relative to
        the remote home), over the same connection; nobody but the user may read the copy."""
        ssh = shlex.join(["ssh", *self.ssh_options()])
        # umask 077 on the remote side: the parents --mkpath makes (the staging directory
        # that lists every snapshot id) are the user's alone too, not only the copied files
        argv = ["rsync", "--archive", "--from0", "--files-from=-", "--mkpath",
                "--chmod=go-rwx", "--rsync-path=umask 077 && rsync", "-e", ssh,
                f"{root.rstrip('/')}/",
                f"{self.target.destination}:{dest.rstrip('/')}/"]
        data = b"".join(f.encode("utf-8", "surrogateescape") + b"\0" for f in files)
        try:
            proc = subprocess.run(argv, input=data, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"copying {root} to {self.target} took over {timeout:g} s") from None
        if proc.returncode != 0:
            text = proc.stderr.decode("utf-8", "replace")
            error = classify(self.target, SSH_EXIT if "ssh" in text.lower() and proc.returncode
                             in (12, 255) else proc.returncode, text, self.remote_command)
            last = text.strip().splitlines()[-1] if text.strip() else "no message"
            raise error or RemoteError(f"copying {root} to {self.target}:{dest} failed "
                                       f"(rsync exit {proc.returncode}): {last} (is rsync "
                                       "installed on the cluster?)")

    def close(self) -> None:
        """End the shared connection and the warm server now (they would end ``persist_s``
        after their last use)."""
        self.warm.stop()
        subprocess.run(["ssh", *self.ssh_options(), "-O", "exit", self.target.destination],
                       capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
