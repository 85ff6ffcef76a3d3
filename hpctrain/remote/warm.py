"""The client side of the warm server (:mod:`hpctrain.remote.server`): short commands at the
cost of one round trip, not of a Python start on the cluster.

The first short command of a connection starts the server over ssh (``_serve daemon``) and
has the shared ssh connection forward a local socket (in the 0700 control directory) to the
server's socket; later commands, in this process or the next CLI call, connect to the local
socket and send the argv. Anything in the way (a cluster whose hpctrain predates the server,
an sshd that forbids socket forwarding, ``HPCTRAIN_REMOTE_SERVER=0``) leaves the plain ssh
path, which always works: the warm path is an optimisation, never a requirement. After a
failure to start, the plain path is used for ``persist_s`` before trying again, so a cluster
without the server costs nothing extra per command.

Only commands that end by themselves and may safely run twice go this way (``status``
without ``--watch``, ``logs`` without ``--follow``, ``cancel``, ``report``, ``_serve info``
and ``_serve result``): a server that vanishes before its first answer is retried over ssh.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import IO, Any, Callable, Protocol, Sequence

from hpctrain import __version__, protocol
from hpctrain.errors import RemoteError
from hpctrain.remote import frames
from hpctrain.remote.controldir import control_dir

ENV = protocol.REMOTE_SERVER          # "0": every command over plain ssh
Write = Callable[[bytes], None]


class Link(Protocol):
    """What the warm path needs of the ssh connection it rides (an
    :class:`hpctrain.remote.ssh.Connection`, which makes its own :class:`WarmPath`)."""

    target: Any
    ssh_config: str | None
    remote_command: list[str]
    persist_s: int

    def hpctrain(self, args: Sequence[str]) -> Any:
        """Run hpctrain there over plain ssh (a CompletedProcess)."""

    def forward_socket(self, local: Path, remote: str) -> bool:
        """Forward unix socket ``local`` here to ``remote`` there."""


def eligible(args: Sequence[str]) -> bool:
    """Whether ``hpctrain ARGS`` may go to the warm server: it ends by itself and running it
    twice does no harm. Pure."""
    if not args:
        return False
    name, rest = args[0], list(args[1:])
    if name == "status":
        return not any(a == "--watch" or a.startswith("--watch=") for a in rest)
    if name == "logs":
        return not any(a == "--follow" or (a.startswith("-") and not a.startswith("--")
                                           and "f" in a) for a in rest)
    if name in ("cancel", "report"):
        return True
    return name == "_serve" and bool(rest) and rest[0] in ("info", "result")


def server_name(conn: Link) -> str:
    """One server per user, destination, ssh config and remote command. Pure but for the
    uid."""
    key = json.dumps([str(conn.target), conn.ssh_config, conn.remote_command, os.getuid()])
    return hashlib.sha1(key.encode()).hexdigest()[:16]


class WarmPath:
    """The warm server of one connection, as seen from here."""

    def __init__(self, conn: Link) -> None:
        self.conn = conn
        self.name = server_name(conn)
        here = control_dir()
        self.local = here / f"{self.name}.warm"
        self.off_marker = here / f"{self.name}.nowarm"

    def enabled(self) -> bool:
        if os.environ.get(ENV, "1").strip().lower() in ("0", "no", "false", "off"):
            return False
        try:
            return time.time() - self.off_marker.stat().st_mtime > self.conn.persist_s
        except FileNotFoundError:
            return True

    def run(self, args: Sequence[str], out: Write, err: Write,
            timeout_s: float | None = None) -> int | None:
        """Run ``hpctrain ARGS`` on the server, its output to ``out``/``err``; its exit code,
        or None when the warm path is not there (then the caller uses plain ssh)."""
        if not (self.enabled() and eligible(args)):
            return None
        code = self._try(args, out, err, timeout_s)
        if code is None and self._start():
            code = self._try(args, out, err, timeout_s)
        if code is None:
            self.off_marker.touch()
        return code

    def stop(self) -> None:
        """Ask the server to end now (it would end ``persist_s`` after its last request)."""
        if self.local.exists():
            frames.ask(self.local, {"stop": True}, timeout_s=5)

    # ---- inside ------------------------------------------------------------------------------
    def _try(self, args: Sequence[str], out: Write, err: Write,
             timeout_s: float | None) -> int | None:
        """The exit code; None when no server answered (nothing was written)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            try:
                sock.connect(str(self.local))
                sock.sendall(frames.request_line({"argv": list(args),
                                                  "client_version": __version__}))
            except OSError:
                return None
            return self._answer(sock, args, out, err, timeout_s)
        finally:
            sock.close()

    def _answer(self, sock: socket.socket, args: Sequence[str], out: Write, err: Write,
                timeout_s: float | None) -> int | None:
        reader, answered = frames.Reader(), False
        while True:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                raise RemoteError(f"{self.conn.target} did not answer within {timeout_s:g} s "
                                  f"(running {args[0]!r} there)") from None
            except OSError:
                chunk = b""
            if not chunk:
                if not answered:
                    return None          # the forward is there, the server is not
                raise RemoteError(f"the connection to {self.conn.target} broke while "
                                  f"{args[0]!r} answered (its output above is incomplete)")
            try:
                for kind, payload in reader.feed(chunk):
                    answered = True
                    if kind == frames.EXIT:
                        return frames.exit_code(payload)
                    (out if kind == frames.STDOUT else err)(payload)
            except frames.FrameError as exc:
                raise RemoteError(
                    f"the hpctrain server on {self.conn.target} answered {args[0]!r} with "
                    f"something that is not its protocol ({exc}); {ENV}=0 runs commands "
                    "over plain ssh meanwhile (please report this)") from None

    def _start(self) -> bool:
        """Start (or find) the server over ssh and forward the local socket to it."""
        proc = self.conn.hpctrain(["_serve", "daemon", "--name", self.name,
                                   "--idle", str(self.conn.persist_s)])
        if proc.returncode != 0:
            return False                # e.g. an hpctrain there without the server
        try:
            remote = json.loads(proc.stdout.decode().strip().splitlines()[-1])["socket"]
        except (ValueError, IndexError, KeyError):
            return False
        return self.conn.forward_socket(self.local, str(remote))


def relay(target: IO[str]) -> Write:
    """A writer of answer bytes to a text stream of ours (stdout, stderr), flushed as they
    come; through its binary buffer where it has one (a notebook's streams have none)."""
    buffer = getattr(target, "buffer", None)

    def write(data: bytes) -> None:
        if buffer is not None:
            target.flush()
            buffer.write(data)
            buffer.flush()
        else:
            target.write(data.decode("utf-8", "replace"))
            target.flush()
    return write
