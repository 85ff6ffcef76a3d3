"""The progress channel: how the ranks' progress reaches the supervisor without touching
shared storage, and how the supervisor's requests reach the ranks. Defined once for both
ends (:mod:`hpctrain.runtime.relay` in the ranks, :mod:`hpctrain.supervisor.board` in the
batch step). Standard library only.

Per rank, nothing leaves the node: each rank rewrites its record in a node-local
directory (``/dev/shm`` unless ``HPCTRAIN_LOCAL_DIR`` says otherwise; :func:`node_dir`).
Per node, one of its ranks (whichever holds the directory's lock: a rank that dies lets
it go, and another takes it within half a second) is the *relay*: every heartbeat it
sends the node's records to the supervisor in one UDP datagram, and it writes the
supervisor's requests (stacks, leave the attempt, go on) into the node-local directory,
where the ranks look for them. A rank also sends its own record at once when it says
something that cannot wait for the beat (its attempt failed, its work ended).

So the supervisor receives one message per node per heartbeat, whatever the ranks per
node, and the shared file system sees none of it. UDP because a lost message costs
nothing: the next beat repeats it, and a missed request is sent again in the reply to
every relay message while it stands. A message carries the job's secret (``token``, in
the step's environment only): the port is reachable by anyone on the cluster network.

A message is zlib-compressed JSON: ``{"token", "kind", ...}`` with kind ``records``
(``node``, ``relay``: sent by a node's relay, ``records``: a list of progress records,
``key=value`` strings as in the files) or ``requests`` (``requests``: {name: record}).

A node's relay also leaves one sign on shared storage as it first sends
(:func:`sign_path`: ``<state dir>/channel/r<restart>-<node>``, a record of where it sends
to and how the first send went): the supervisor can then tell ranks whose datagrams never
arrive (a firewall between the compute nodes drops UDP) from a script that sends none
(:mod:`hpctrain.supervisor.silence`). One small file per node per run, written once.
"""

from __future__ import annotations

import json
import os
import socket
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

PORT = "HPCTRAIN_PROGRESS_PORT"      # the supervisor's UDP port (set in the step's env)
HOST = "HPCTRAIN_PROGRESS_HOST"      # its address, when Slurm's launch node address is not
TOKEN = "HPCTRAIN_PROGRESS_TOKEN"    # the job's secret: a message without it is dropped
LOCAL_DIR = "HPCTRAIN_LOCAL_DIR"     # where node-local directories go (default /dev/shm)

RECORDS, REQUESTS = "records", "requests"
SIGNS = "channel"       # in the state directory: one sign per node whose ranks send
MAX_RECORDS = 48        # records per datagram: well under UDP's 64 KiB even uncompressed
MAX_DATAGRAM = 65507


def encode(token: str, kind: str, **fields: Any) -> bytes:
    return zlib.compress(json.dumps({"token": token, "kind": kind, **fields},
                                    separators=(",", ":")).encode("utf-8"), 1)


def decode(token: str, data: bytes) -> dict[str, Any] | None:
    """The message in ``data`` when it is well formed and carries ``token``; else None."""
    try:
        message = json.loads(zlib.decompress(data).decode("utf-8"))
    except (zlib.error, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(message, dict) or message.get("token") != token or not token:
        return None
    return message


def records_messages(token: str, node: str, records: list[Mapping[str, object]],
                     relay: bool) -> list[bytes]:
    """``records`` as one datagram per MAX_RECORDS of them (a node with many ranks)."""
    rows = [{k: str(v) for k, v in r.items()} for r in records]
    return [encode(token, RECORDS, node=node, relay=relay, records=rows[i:i + MAX_RECORDS])
            for i in range(0, max(len(rows), 1), MAX_RECORDS)]


def address(env: Mapping[str, str]) -> tuple[str, int] | None:
    """Where the supervisor listens, from the rank's environment: HPCTRAIN_PROGRESS_HOST,
    else the address Slurm gives of the node that launched the step (the supervisor's:
    srun runs there), else this host. None without a port (no supervisor, or an older one)."""
    port = env.get(PORT, "")
    if not port.isdigit():
        return None
    host = env.get(HOST) or env.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"
    return host, int(port)


def node_dir(env: Mapping[str, str], run_id: str, restart_count: int, node: str) -> Path:
    """This node's directory for job run ``run_id``: node-local memory (``/dev/shm``), else
    the temporary directory. The node's name is in it: emulated nodes share one host."""
    root = env.get(LOCAL_DIR) or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp")
    return Path(root) / f"hpctrain-{os.getuid()}" / _safe(
        f"{run_id}-{restart_count}-{node or 'node'}")


def sign_path(state_dir: str | os.PathLike[str], restart_count: int, node: str) -> Path:
    """Where node ``node``'s relay signs that its ranks send progress datagrams, in run
    ``restart_count`` of the job whose state directory is ``state_dir``."""
    return Path(state_dir) / SIGNS / f"r{restart_count}-{_safe(node or 'node')}"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def udp_socket(bind: tuple[str, int] | None = None, buffer: int = 0) -> socket.socket:
    """A non-blocking UDP socket (bound when ``bind``), its receive buffer raised to
    ``buffer`` bytes when given (the kernel caps it at net.core.rmem_max)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    if bind is not None:
        sock.bind(bind)
    sock.setblocking(False)
    return sock


def incoming(sock: socket.socket, token: str, kind: str
             ) -> Iterator[tuple[dict[str, Any], tuple[str, int]]]:
    """Every datagram waiting on non-blocking ``sock`` that is a ``kind`` message with
    ``token``, with its sender; others are dropped. Ends when nothing more is waiting (or
    the socket reports an error: e.g. ECONNREFUSED for an earlier send)."""
    while True:
        try:
            data, sender = sock.recvfrom(MAX_DATAGRAM)
        except OSError:       # BlockingIOError included: nothing more to read
            return
        message = decode(token, data)
        if message is not None and message.get("kind") == kind:
            yield message, sender
