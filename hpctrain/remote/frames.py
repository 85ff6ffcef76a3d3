"""The warm server's wire format (``hpctrain.remote.server`` and ``.warm``).

A client sends one request, a JSON object on one line::

    {"argv": ["status", "--json"], "client_version": "0.7.0"}
    {"ping": true}                    # is a server there, and which code does it run?
    {"stop": true}                    # end the server (Cluster.close)

and reads frames until the exit frame: one kind byte, a 4-byte big-endian length, the
payload. ``o``: bytes of the command's stdout; ``e``: of its stderr; ``x``: its exit code
(ASCII digits), always last. Keeping stdout and stderr apart is the point: ``--host H
status --json | jq`` must see the JSON alone, as over plain ssh.
"""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from typing import Any, Iterator

STDOUT, STDERR, EXIT = b"o", b"e", b"x"
KINDS = (STDOUT, STDERR, EXIT)
MAX_REQUEST = 1 << 20      # a request is an argv: a megabyte is already absurd
_HEAD = struct.Struct(">cI")


class FrameError(ValueError):
    """The peer sent something that is not this protocol (or hung up mid-frame)."""


def pack(kind: bytes, payload: bytes) -> bytes:
    """One frame. Pure."""
    if kind not in KINDS:
        raise ValueError(f"frame kind {kind!r} is not one of {KINDS}")
    return _HEAD.pack(kind, len(payload)) + payload


def exit_frame(code: int) -> bytes:
    return pack(EXIT, str(int(code)).encode())


def request_line(request: dict[str, Any]) -> bytes:
    """A request as sent: compact JSON and a newline. Pure."""
    return json.dumps(request, separators=(",", ":")).encode() + b"\n"


def parse_request(line: bytes) -> dict[str, Any]:
    """The request a client sent; FrameError for anything else. Pure."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise FrameError(f"the request is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise FrameError("the request is not a JSON object")
    argv = data.get("argv")
    if argv is not None and not (isinstance(argv, list) and all(isinstance(a, str)
                                                                for a in argv)):
        raise FrameError("argv must be a list of strings")
    return data


class Reader:
    """Frames out of a byte stream fed in pieces (``feed``), for a socket read loop."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The frames that ``data`` completes, in order."""
        self._buf += data
        while len(self._buf) >= _HEAD.size:
            kind, size = _HEAD.unpack_from(self._buf)
            if kind not in KINDS:
                raise FrameError(f"unknown frame kind {kind!r}")
            end = _HEAD.size + size
            if len(self._buf) < end:
                return
            payload = bytes(self._buf[_HEAD.size:end])
            del self._buf[:end]
            yield kind, payload

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame (non-zero at EOF: the peer hung up mid-frame)."""
        return len(self._buf)


def exit_code(payload: bytes) -> int:
    try:
        return int(payload.decode("ascii"))
    except ValueError:
        raise FrameError(f"bad exit frame {payload[:20]!r}") from None


def ask(path: Path, request: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any] | None:
    """Send a ping or stop to the server listening at ``path``; its JSON answer (``{}`` for
    none), or None when no server answers there."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            sock.sendall(request_line(request))
            reader, out = Reader(), b""
            while chunk := sock.recv(65536):
                for kind, payload in reader.feed(chunk):
                    if kind == STDOUT:
                        out += payload
                    elif kind == EXIT:
                        return json.loads(out or b"{}")
    except (OSError, ValueError):
        return None
    return None
