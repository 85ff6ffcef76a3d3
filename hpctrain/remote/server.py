"""The warm server: the cluster side of ``--host``'s fast path (``hpctrain _serve daemon``).

Over plain ssh, every ``--host`` command starts a Python and imports hpctrain on the
cluster before it asks Slurm anything: about as long as the command itself. The warm
server pays that once. It is one process per user and client (``--name``), started by the
client over its ssh connection, listening on a unix socket in a 0700 directory of the
user's on the login node (``$XDG_RUNTIME_DIR/hpctrain``, else ``/tmp/hpctrain-serve-UID``);
the client reaches it through its ssh connection's socket forwarding, so nothing listens
on the network and only the user (the socket's owner, checked per connection) gets in.

Each request runs in a fork of the server: the ordinary CLI (:func:`hpctrain.cli.main`),
with its stdout and stderr sent back as frames (:mod:`hpctrain.remote.frames`), so its
output, messages and exit code are those of the same command over ssh. The server ends
after ``idle_s`` without a request, when asked to (``stop``), and when the hpctrain code
it runs has changed on disk (an upgrade is never served by the old code).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import select
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hpctrain import __version__, access, protocol
from hpctrain.errors import HpctrainError, RemoteError
from hpctrain.remote import frames

IDLE_S = 600
NAME = re.compile(r"^[0-9a-f]{16}$")
LOG_MAX = 1 << 20
# imported once in the server, so a request's fork starts with them loaded
PRELOAD = ("hpctrain.cli", "hpctrain.commands.status", "hpctrain.commands.logs",
           "hpctrain.commands.cancel", "hpctrain.commands.report", "hpctrain.commands.serve")


def socket_dir() -> Path:
    """This user's 0700 directory for server sockets on this node (node-local, never the
    shared home: a socket there would be seen, and refused, on the other login nodes)."""
    candidates = []
    if os.environ.get("XDG_RUNTIME_DIR"):
        candidates.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "hpctrain")
    candidates.append(Path(tempfile.gettempdir()) / f"hpctrain-serve-{os.getuid()}")
    reasons = []
    for path in candidates:
        why = access.own_dir(path, 0o700, parents=False)
        if why is None:
            return path
        reasons.append(f"{path}: {why}")
    raise RemoteError("no private directory for the warm server's socket ("
                      + "; ".join(reasons) + "): remove or fix it, or set "
                      f"{protocol.REMOTE_SERVER}=0 on the client to use plain ssh")


def code_signature(root: Path | None = None) -> str:
    """What code a server runs: the interpreter, hpctrain's version and every module file's
    size and mtime (about 1 ms: checked before each request). A server whose signature no
    longer matches the disk stops serving. The interpreter is its resolved path: ``python
    -m hpctrain`` and the ``hpctrain`` script (``python3``, another link to the same one)
    run the same code."""
    python = os.path.realpath(sys.executable)
    digest = hashlib.sha1(f"{python}\0{__version__}".encode())
    stack = [str(root or Path(__file__).resolve().parents[1])]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir(follow_symlinks=False) and entry.name != "__pycache__":
                    stack.append(entry.path)
                elif entry.name.endswith(".py"):
                    st = entry.stat()
                    digest.update(f"{entry.path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


# ---- starting ----------------------------------------------------------------------------------
def start(name: str, idle_s: float = IDLE_S) -> dict[str, Any]:
    """Make sure a server ``name`` runs this code; where its socket is. A running one of
    the same code is kept; one of other code is stopped and replaced."""
    if not NAME.match(name):
        raise HpctrainError(f"_serve daemon --name {name!r}: 16 hex digits expected (the "
                            "client makes it)")
    where = socket_dir()
    path = where / f"{name}.sock"
    signature = code_signature()
    with open(where / f"{name}.lock", "a", opener=_private) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)    # two clients starting at once get one server
        running = frames.ask(path, {"ping": True})
        if running and running.get("signature") == signature:
            return {"socket": str(path), "pid": running.get("pid"), "started": False}
        if running:
            frames.ask(path, {"stop": True})
            # it removes its socket on the way out: let it, before ours takes the name
            deadline = time.monotonic() + 5
            while path.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old)
        listener.listen(64)
        pid = os.fork()
        if pid == 0:                                          # the server
            lock.close()      # else the server would hold the lock for its whole life
            _daemon_child(listener, path, where / f"{name}.log", idle_s, signature)
        listener.close()
    return {"socket": str(path), "pid": pid, "started": True}


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def _daemon_child(listener: socket.socket, path: Path, log: Path, idle_s: float,
                  signature: str) -> None:
    """Detach (own session, no terminal, the ssh channel's pipes closed so the ssh command
    that started us returns), then serve until idle; never returns."""
    code = 0
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        if log.exists() and log.stat().st_size > LOG_MAX:
            log.unlink()
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.chdir(Path.home())   # where a command over ssh runs
        Server(listener, path, idle_s, signature).serve()
    except BaseException as exc:   # the log is the only place left to say it
        print(f"{time.strftime('%F %T')} server ended: {exc!r}", file=sys.stderr, flush=True)
        code = 1
    os._exit(code)


class Server:
    """The accept loop: one fork per request, answers to ping and stop itself."""

    def __init__(self, listener: socket.socket, path: Path, idle_s: float, signature: str) -> None:
        self.listener = listener
        self.path = path
        self.inode = os.stat(path).st_ino
        self.idle_s = idle_s
        self.signature = signature

    def serve(self) -> None:
        import importlib

        signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # the kernel reaps request forks
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        for module in PRELOAD:
            importlib.import_module(module)
        self.log(f"serving {self.path} (pid {os.getpid()}, idle {self.idle_s:g} s)")
        self.listener.settimeout(self.idle_s)
        try:
            while self.accept_one():
                pass
        finally:
            self.listener.close()
            self.unlink()

    def accept_one(self) -> bool:
        """Serve one connection; False when the server should end."""
        try:
            conn, _ = self.listener.accept()
        except socket.timeout:
            self.log("idle: ending")
            return False
        with conn:
            if _peer_uid(conn) != os.getuid():
                return True           # root aside, the 0700 directory already keeps others out
            conn.settimeout(10)
            try:
                request = frames.parse_request(_read_line(conn))
            except (frames.FrameError, OSError) as exc:
                self.log(f"bad request: {exc}")
                return True
            if request.get("ping"):
                answer = {"signature": self.signature, "pid": os.getpid(), "version": __version__}
                conn.sendall(frames.pack(frames.STDOUT, json.dumps(answer).encode())
                             + frames.exit_frame(0))
                return True
            if request.get("stop"):
                conn.sendall(frames.exit_frame(0))
                self.log("asked to stop")
                return False
            if code_signature() != self.signature:
                # hang up unanswered: the client runs the command over ssh (the new code)
                # and starts a server of the new code
                self.log("hpctrain changed on disk: ending")
                return False
            if os.fork() == 0:
                self.listener.close()
                Request(conn, request).run_and_exit()
        return True

    def unlink(self) -> None:
        try:
            if os.stat(self.path).st_ino == self.inode:    # not a newer server's socket
                self.path.unlink()
        except OSError:
            pass

    @staticmethod
    def log(message: str) -> None:
        print(f"{time.strftime('%F %T')} {message}", file=sys.stderr, flush=True)


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise frames.FrameError("the client hung up before its request ended")
        data += chunk
        if len(data) > frames.MAX_REQUEST:
            raise frames.FrameError("the request is too long")
    return data


class Request:
    """One command in a fork of the server: fds 1 and 2 are pipes whose bytes a thread
    sends as frames (a subprocess writing to them is relayed too), then the exit frame."""

    def __init__(self, conn: socket.socket, request: dict[str, Any]) -> None:
        self.conn = conn
        self.request = request
        self.broken = False
        self.log_fd = os.dup(2)        # the server's log, once fd 2 is the command's
        conn.settimeout(None)          # a reader slow to take the output (a pager) is no error
        self.started = time.monotonic()

    def run_and_exit(self) -> None:
        code = 1
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # subprocess needs its exit codes
            pump = self._redirect()
            code = self._run()
            self._restore()
            pump.join()
            if not self.broken:
                self.conn.sendall(frames.exit_frame(code))
            what = " ".join(self.request["argv"][:2])
            os.write(self.log_fd, f"{time.strftime('%F %T')} {what}: exit {code} ("
                     f"{(time.monotonic() - self.started) * 1000:.0f} ms, pid "
                     f"{os.getpid()})\n".encode())
        finally:
            os._exit(0)

    def _redirect(self) -> threading.Thread:
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (out_w, err_w, null):
            os.close(fd)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True)    # as PYTHONUNBUFFERED over ssh
        pump = threading.Thread(target=self._pump, args=(out_r, err_r), daemon=True)
        pump.start()
        return pump

    def _run(self) -> int:
        from hpctrain.cli import main

        argv = ["--client-version", str(self.request.get("client_version", __version__)),
                *self.request["argv"]]
        try:
            return main(argv)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1
        except BaseException:      # what Python would print at exit, for the client to see
            import traceback
            traceback.print_exc()
            return 1

    def _restore(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)     # the pipes' last write ends: the pump sees EOF
        os.dup2(null, 2)

    def _pump(self, out_r: int, err_r: int) -> None:
        kinds = {out_r: frames.STDOUT, err_r: frames.STDERR}
        while kinds:
            ready, _, _ = select.select(list(kinds), [], [])
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    os.close(fd)
                    del kinds[fd]
                elif not self.broken:   # a client gone: keep draining, so the command ends
                    try:
                        self.conn.sendall(frames.pack(kinds[fd], data))
                    except OSError:
                        self.broken = True
