"""The live query: ``hpctrain status`` asks a running job's supervisor for rank 0's newest
progress record over the network, instead of reading a summary rewritten every 15 s.

Defined once for both ends: :mod:`hpctrain.supervisor.live` answers in the batch step,
:func:`ask` asks from the login node. Standard library only.

Who may ask: only the job's own user. The supervisor writes its address and a fresh
secret into the job's state directory (the ``live`` record, 0600 in the 0700 state
directory: :func:`write_address`), and answers only a request that carries a MAC of that
secret over the job's key, a nonce and the time (HMAC-SHA256; the secret itself never
travels). A request older than FRESH_S, or one whose nonce it has seen, is dropped: a
request copied off the network cannot be played again. The answer carries its own MAC,
so the login node shows nothing that the supervisor did not say.

One UDP datagram each way, like the progress channel (:mod:`hpctrain.protocol.channel`):
a lost one is asked again once, and a supervisor that does not answer within ASK_S (gone,
or a site's firewall between login and compute nodes) leaves ``status`` to the summary
file, which the supervisor writes whether or not it can be asked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import select
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctrain.files import atomic_write
from hpctrain.protocol import LIVE, format_record, parse_record

VERSION = "1"
FRESH_S = 60.0          # a request's time may differ this much from the supervisor's clock
# how long the login node waits for an answer: a second try after RETRY_S (a datagram
# lost), then ASK_S in all (a supervisor that is gone costs no more than that)
RETRY_S, ASK_S = 0.3, 0.8
MAX_ANSWER = 16384


@dataclass(frozen=True)
class Address:
    """Where a job's supervisor answers, and the secret a request must prove it knows."""

    key: str            # the job's key (Slurm job id, or ARRAY_TASK)
    run_id: str
    restart_count: int
    host: str
    port: int
    secret: bytes

    def fields(self) -> dict[str, str]:
        return {"job": self.key, "run_id": self.run_id,
                "restart_count": str(self.restart_count), "host": self.host,
                "port": str(self.port), "secret": self.secret.hex()}

    @classmethod
    def parse(cls, record: Mapping[str, str]) -> Address | None:
        try:
            port, secret = int(record.get("port", "")), bytes.fromhex(record.get("secret", ""))
            restart = int(record.get("restart_count", "0"))
        except ValueError:
            return None
        if not record.get("host") or not 0 < port < 65536 or len(secret) < 16:
            return None
        return cls(record.get("job", ""), record.get("run_id", ""), restart,
                   record["host"], port, secret)


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def write_address(state: str | os.PathLike[str], address: Address) -> None:
    """The ``live`` record, 0600 from its first byte whatever the umask: the secret in it
    is what lets a request through."""
    atomic_write(Path(state) / LIVE, format_record(address.fields()), mode=0o600)


def read_address(state: str | os.PathLike[str]) -> Address | None:
    """The ``live`` record of state directory ``state``; None when there is none, or when
    it is not this user's own 0600 file (planted by someone else, or opened up: a record
    another user could have written could point the login node anywhere)."""
    path = Path(state) / LIVE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            return None
        text = os.read(fd, 4096).decode("utf-8", errors="replace")
    finally:
        os.close(fd)
    return Address.parse(parse_record(text))


def _mac(secret: bytes, *parts: str) -> str:
    return hmac.new(secret, "\n".join(parts).encode("utf-8"), hashlib.sha256).hexdigest()


def request(address: Address, now: float, nonce: str | None = None) -> tuple[bytes, str]:
    """A request for ``address``'s job, and its nonce (the answer must name it)."""
    nonce = nonce or secrets.token_hex(16)
    t = f"{now:.3f}"
    return json.dumps({"v": VERSION, "job": address.key, "nonce": nonce, "t": t,
                       "mac": _mac(address.secret, "ask", address.key, nonce, t)}
                      ).encode("utf-8"), nonce


def checked_request(address: Address, data: bytes, now: float,
                    seen: dict[str, float]) -> str | None:
    """The nonce of request ``data`` when it is this job's, fresh, new and carries the MAC
    of the secret; None otherwise (dropped without an answer). ``seen``: the nonces taken
    in the last FRESH_S (updated, and kept that short)."""
    try:
        message = json.loads(data.decode("utf-8"))
        nonce, t, mac = str(message["nonce"]), str(message["t"]), str(message["mac"])
        age = abs(now - float(t))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if message.get("v") != VERSION or message.get("job") != address.key or age > FRESH_S:
        return None
    if not hmac.compare_digest(mac, _mac(address.secret, "ask", address.key, nonce, t)):
        return None
    for old in [n for n, at in seen.items() if now - at > FRESH_S]:
        del seen[old]
    if nonce in seen:
        return None      # played again
    seen[nonce] = now
    return nonce


def answer(address: Address, nonce: str, record: Mapping[str, str], now: float) -> bytes:
    """The answer to request ``nonce``: ``record`` (rank 0's progress, {} before any),
    the supervisor's time, and their MAC."""
    body = json.dumps({"record": dict(record), "t": f"{now:.3f}"}, sort_keys=True)
    return json.dumps({"nonce": nonce, "body": body,
                       "mac": _mac(address.secret, "answer", nonce, body)}).encode("utf-8")


@dataclass(frozen=True)
class Answer:
    """What the supervisor said: rank 0's newest record ({} before its first) and when."""

    record: dict[str, str]
    at: float


def checked_answer(address: Address, nonce: str, data: bytes) -> Answer | None:
    """The answer in ``data`` when it is to request ``nonce`` and carries the MAC."""
    try:
        message = json.loads(data.decode("utf-8"))
        body = str(message["body"])
        if message.get("nonce") != nonce or not hmac.compare_digest(
                str(message["mac"]), _mac(address.secret, "answer", nonce, body)):
            return None
        inner = json.loads(body)
        record = {str(k): str(v) for k, v in dict(inner["record"]).items()}
        return Answer(record, float(inner["t"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def ask(addresses: Sequence[Address], wait_s: float = ASK_S) -> dict[str, Answer]:
    """Ask every supervisor in ``addresses`` at once; their answers by job key (a job
    whose supervisor did not answer within ``wait_s`` is left out). One socket, one
    datagram per job (a second one after RETRY_S to those yet to answer)."""
    if not addresses:
        return {}
    answers: dict[str, Answer] = {}
    pending: dict[str, _Pending] = {}
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        for address in addresses:
            try:
                target = socket.getaddrinfo(address.host, address.port, socket.AF_INET,
                                            socket.SOCK_DGRAM)[0][4][:2]
            except (OSError, IndexError):
                continue      # a name this node cannot resolve: the summary answers
            pending[address.key] = _Pending(address, target)
        start, retried = time.monotonic(), False
        _send_all(sock, pending)
        while pending and (spent := time.monotonic() - start) < wait_s:
            if not retried and spent >= RETRY_S:
                _send_all(sock, pending)       # to those yet to answer: a datagram lost
                retried = True
            until = start + (wait_s if retried else min(RETRY_S, wait_s))
            ready, _, _ = select.select([sock], [], [], max(0.0, until - time.monotonic()))
            if ready:
                _take(sock, pending, answers)
    finally:
        sock.close()
    return answers


@dataclass
class _Pending:
    """A job asked and not yet answered: where, and the nonces of the requests sent (a
    late answer to the first is as good as one to the second)."""

    address: Address
    target: tuple[str, int]
    nonces: tuple[str, ...] = ()


def _send_all(sock: socket.socket, pending: dict[str, _Pending]) -> None:
    for asked in pending.values():
        data, nonce = request(asked.address, time.time())
        asked.nonces += (nonce,)
        try:
            sock.sendto(data, asked.target)
        except OSError:
            pass      # unreachable now: its time runs out like a lost datagram


def _take(sock: socket.socket, pending: dict[str, _Pending],
          answers: dict[str, Answer]) -> None:
    while True:
        try:
            data, _ = sock.recvfrom(MAX_ANSWER)
        except OSError:      # nothing more waiting (or an ICMP error for a send)
            return
        for key, asked in list(pending.items()):
            found = next((a for n in asked.nonces
                          if (a := checked_answer(asked.address, n, data)) is not None), None)
            if found is not None:
                answers[key] = found
                del pending[key]
                break
