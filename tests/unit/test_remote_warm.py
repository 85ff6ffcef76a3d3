"""The warm server of ``--host`` (hpctrain.remote.frames, .server, .warm): its wire format and
which commands may use it (pure), and a real server on this machine, reached on its socket
without ssh (the path through the devcluster's sshd is in tests/cluster/test_ssh_cluster.py).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain import __version__
from hpctrain.remote import frames
from hpctrain.remote.frames import ask
from hpctrain.remote.server import code_signature
from hpctrain.remote.warm import eligible

HPCTRAIN = str(Path(sys.executable).with_name("hpctrain"))


# ---- the wire format ----------------------------------------------------------------------------
def test_frames_survive_any_split_of_the_stream() -> None:
    stream = (frames.pack(frames.STDOUT, b"out\n") + frames.pack(frames.STDERR, b"")
              + frames.pack(frames.STDERR, b"err " * 5000) + frames.exit_frame(3))
    for step in (1, 7, 4096, len(stream)):
        reader, got = frames.Reader(), []
        for i in range(0, len(stream), step):
            got += list(reader.feed(stream[i:i + step]))
        assert got == [(b"o", b"out\n"), (b"e", b""), (b"e", b"err " * 5000), (b"x", b"3")]
        assert reader.pending == 0
    half = frames.Reader()
    assert list(half.feed(frames.pack(frames.STDOUT, b"abcdef")[:7])) == []
    assert half.pending == 7                 # a peer that hung up mid-frame is noticed


def test_bad_frames_and_requests_are_refused_by_name() -> None:
    with pytest.raises(frames.FrameError, match="unknown frame kind"):
        list(frames.Reader().feed(b"z\0\0\0\0"))
    with pytest.raises(frames.FrameError, match="not JSON"):
        frames.parse_request(b"status\n")
    with pytest.raises(frames.FrameError, match="list of strings"):
        frames.parse_request(b'{"argv": "status; rm -rf ~"}\n')
    with pytest.raises(frames.FrameError, match="bad exit frame"):
        frames.exit_code(b"zero")
    assert frames.parse_request(frames.request_line({"argv": ["status", "--json"]})) == \
        {"argv": ["status", "--json"]}


@pytest.mark.parametrize("args, warm", [
    (["status"], True), (["status", "--json", "12"], True), (["status", "--watch"], False),
    (["status", "--watch=2"], False), (["logs", "12"], True), (["logs", "12", "-f"], False),
    (["logs", "12", "--follow"], False), (["logs", "-f", "12"], False),
    (["logs", "12", "--rank", "1"], True), (["cancel", "12"], True), (["report"], True),
    (["_serve", "info", "12"], True), (["_serve", "result", "12"], True),
    (["_serve", "wait", "12"], False), (["_serve", "submit"], False),
    (["submit", "job.toml"], False), (["sweep", "job.toml"], False), ([], False),
])
def test_only_short_repeatable_commands_go_warm(args: list[str], warm: bool) -> None:
    # a command that waits (--follow, --watch, wait) or must not run twice (submit) keeps
    # its own ssh session
    assert eligible(args) is warm


def test_code_signature_follows_the_module_files(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    module = tmp_path / "pkg" / "a.py"
    module.write_text("x = 1\n")
    before = code_signature(tmp_path)
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "notes.txt").write_text("not code")
    assert code_signature(tmp_path) == before
    module.write_text("x = 22\n")              # an upgrade, an edit
    assert code_signature(tmp_path) != before


def test_code_signature_is_the_same_through_any_link_to_the_interpreter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `python -m hpctrain` and the `hpctrain` script (whose shebang says python3) start the
    # same interpreter by two names: a server started by one serves the other
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    real = os.path.realpath(sys.executable)
    link = tmp_path / "bin" / "python3"
    link.parent.mkdir()
    link.symlink_to(real)
    monkeypatch.setattr(sys, "executable", real)
    by_path = code_signature(tmp_path)
    monkeypatch.setattr(sys, "executable", str(link))
    assert code_signature(tmp_path) == by_path
    other = tmp_path / "bin" / "other-python"   # another interpreter: other code
    other.write_bytes(b"")
    monkeypatch.setattr(sys, "executable", str(other))
    assert code_signature(tmp_path) != by_path


@pytest.mark.parametrize("garbage", [b"?\x00\x00\x00\x01x", frames.pack(frames.EXIT, b"zero")],
                         ids=["unknown kind", "bad exit code"])
def test_a_server_answer_that_is_not_the_protocol_is_a_remote_error(garbage: bytes) -> None:
    """Whatever the server sends, the user gets hpctrain's error naming the host and the
    way around it, not a ValueError's traceback."""
    from types import SimpleNamespace

    from hpctrain.errors import RemoteError
    from hpctrain.remote.warm import WarmPath

    warm = object.__new__(WarmPath)
    warm.conn = SimpleNamespace(target="alice@login1")
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(frames.pack(frames.STDOUT, b"partial ") + garbage)
        theirs.shutdown(socket.SHUT_WR)
        out: list[bytes] = []
        with pytest.raises(RemoteError) as err:
            warm._answer(ours, ["status"], out.append, out.append, 10)
    assert out == [b"partial "]
    assert "alice@login1" in str(err.value) and "HPCTRAIN_REMOTE_SERVER=0" in str(err.value)


# ---- a real server -------------------------------------------------------------------------------
@pytest.fixture()
def runtime() -> Iterator[Path]:
    """An XDG_RUNTIME_DIR as short as a real one (/run/user/UID): a socket's path must fit
    in 107 bytes, which pytest's tmp_path (a parallel worker's, say) may not leave room for."""
    path = Path(tempfile.mkdtemp(prefix="hpct-run-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def server(runtime: Path):
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    argv = [HPCTRAIN, "_serve", "daemon", "--name", "0123456789abcdef", "--idle", "60"]
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    path = Path(data["socket"])
    yield path, data, argv, env
    ask(path, {"stop": True})


def call(path: Path, argv: list[str]) -> tuple[int, bytes, bytes]:
    out, err = b"", b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(str(path))
        sock.sendall(frames.request_line({"argv": argv, "client_version": __version__}))
        reader = frames.Reader()
        while chunk := sock.recv(65536):
            for kind, payload in reader.feed(chunk):
                if kind == frames.EXIT:
                    return frames.exit_code(payload), out, err
                if kind == frames.STDOUT:
                    out += payload
                else:
                    err += payload
    raise AssertionError("no exit frame")


def test_a_server_runs_commands_as_the_cli_would(server, runtime: Path, tmp_path: Path) -> None:
    path, data, argv, env = server
    assert data["started"] is True and path.parent == runtime / "hpctrain"
    # only the user reaches it: a 0700 directory, a 0600 socket
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    code, out, err = call(path, ["--version"])
    assert (code, err) == (0, b"") and out.decode().startswith("hpctrain, version ")
    # an error: on stderr only, with the CLI's exit code and message
    bad = tmp_path / "missing.toml"
    code, out, err = call(path, ["render", str(bad)])
    direct = subprocess.run([HPCTRAIN, "render", str(bad)], capture_output=True, env=env)
    assert code == direct.returncode != 0
    assert (out, err) == (direct.stdout, direct.stderr) and str(bad).encode() in err
    # a client of another release line is refused as over plain ssh
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        sock.sendall(frames.request_line({"argv": ["render", str(bad)],
                                          "client_version": "0.1.0"}))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert b"version skew" in answer
    # starting again finds the running server (two clients at once get one)
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(again.stdout) == {"socket": str(path), "pid": data["pid"],
                                        "started": False}
    log = (path.parent / "0123456789abcdef.log").read_text()
    assert "--version: exit 0" in log and "render" in log


def test_a_stopped_server_removes_its_socket(server) -> None:
    path, data, _, _ = server
    assert ask(path, {"ping": True})["pid"] == data["pid"]
    assert ask(path, {"stop": True}) == {}
    deadline = time.monotonic() + 10
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not path.exists()
    assert ask(path, {"ping": True}) is None


def test_a_server_of_other_code_is_replaced(runtime: Path) -> None:
    # a server still running the code before an upgrade: the next start stops it and
    # serves from a new one under the same name
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    old_code = ("import socket, sys\n"
                "from hpctrain.remote.server import Server, socket_dir\n"
                "path = socket_dir() / 'fedcba9876543210.sock'\n"
                "listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                "listener.bind(str(path)); listener.listen(8)\n"
                "print('up', flush=True)\n"
                "Server(listener, path, 60, 'the code before').serve()\n")
    old = subprocess.Popen([sys.executable, "-c", old_code], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert old.stdout.readline() == "up\n", old.stderr.read()
        path = runtime / "hpctrain" / "fedcba9876543210.sock"
        assert ask(path, {"ping": True})["signature"] == "the code before"
        res = subprocess.run([HPCTRAIN, "_serve", "daemon", "--name", "fedcba9876543210",
                              "--idle", "60"], env=env, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0, res.stderr
        data = json.loads(res.stdout)
        assert data["started"] is True and data["pid"] != old.pid
        assert old.wait(timeout=10) == 0             # asked to stop, and it did
        assert ask(path, {"ping": True})["signature"] == code_signature()
        assert call(path, ["--version"])[0] == 0
    finally:
        old.kill()
        ask(runtime / "hpctrain" / "fedcba9876543210.sock", {"stop": True})
