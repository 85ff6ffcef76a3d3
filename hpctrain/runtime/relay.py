"""A rank's end of the progress channel (:mod:`hpctrain.protocol.channel`). On the one
rank per node that holds the node directory's lock, the relay: the node's records to the
supervisor once a heartbeat, and at once when one of them says something new (an attempt
failed, a rank's work ended); the supervisor's requests into the node directory. A rank
whose work is over sends the node's records one last time if nobody else can
(:meth:`Relay.flush`). Called from the progress thread, and at a rank's exit.

News a rank must not leave to another process (its attempt failed, its work ended) it
also sends itself, one datagram (:meth:`Relay.send_own`): srun ends a step's other tasks
the moment one fails, and the node's relay may be among them (so does a plain script's
rank as it leaves, when another rank holds the role: it cannot wait for it). One datagram per
rank when every rank ends at once (8,192 x ~300 B at the end of an 8,192-rank job: the
supervisor's receive buffer must hold the burst, docs/scale.md).

Each relay leaves one sign in the state directory as it first sends (where to, and how that
went: :func:`hpctrain.protocol.channel.sign_path`), so that the supervisor can tell datagrams
that never arrive from ranks that send none.
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path

from hpctrain import access
from hpctrain import protocol as p
from hpctrain.protocol import channel
from hpctrain.protocol.progress import NEWS
from hpctrain.protocol.records import Sign

LOCK = "relay.lock"
REQUEST_NAMES = (p.DUMP, p.INTERRUPT, p.RESUME)
_RELAYS: weakref.WeakSet[Relay] = weakref.WeakSet()


def _in_forked_child() -> None:
    """A process forked from a rank (a DataLoader worker) drops its copy of the relay
    lock: were it to outlive the rank, the node would keep a relay that never sends."""
    for relay in list(_RELAYS):
        if relay._lock_fd is not None:
            try:
                os.close(relay._lock_fd)    # the parent's lock stays: it has its own fd
            except OSError:
                pass
            relay._lock_fd = None
        relay._lock = threading.Lock()      # a copy of a lock the progress thread held


os.register_at_fork(after_in_child=_in_forked_child)


class Relay:
    """One rank's link to the supervisor (``addr``, checked by ``token``) through its node's
    directory ``local`` (the ranks' records in ``progress/``, the requests beside them)."""

    def __init__(self, local: Path, addr: tuple[str, int], token: str, node: str,
                 beat_s: float, sign: Path | None = None) -> None:
        self.local, self.addr, self.token, self.node = local, addr, token, node
        self.beat_s = beat_s
        self.sign = sign      # where to sign, once, that this node's ranks send (or None)
        self.sock = channel.udp_socket()
        self._lock_fd: int | None = None
        self._next_send = 0.0
        self._written: dict[str, dict[str, str]] = {}
        self._said: tuple = ()     # what the node's records last said (beats aside)
        self._lock = threading.Lock()    # the progress thread's ticks and a rank's urgent one
        self.sent = 0          # datagrams sent (the traffic figures in docs/scale.md)
        self.pid = os.getpid()  # a forked child's copy sends nothing (see _in_forked_child)
        _RELAYS.add(self)

    @property
    def held(self) -> bool:
        return self._lock_fd is not None

    def send_own(self, record: Mapping[str, object]) -> None:
        """This rank's own record, straight to the supervisor: news that must not depend
        on another process (the node's relay may die with its rank a moment later, as
        srun ends a step's other tasks when one fails)."""
        if os.getpid() != self.pid:
            return
        with self._lock:
            self._send(channel.records_messages(self.token, self.node, [record],
                                                relay=False))

    def tick(self) -> None:
        """Take the relay role when nobody on the node holds it; as the relay, write the
        requests that came, and send the node's records once a beat or when one of them
        says something new."""
        if os.getpid() != self.pid:
            return
        with self._lock:
            self._tick()

    def _tick(self) -> None:
        if not self.held:
            self._take()
            if not self.held:
                return
        self._receive()
        records = self.node_records()
        said = news(records)
        now = time.monotonic()
        if now >= self._next_send or said != self._said:
            self._next_send, self._said = now + self.beat_s, said
            self._send_records(records)

    def flush(self) -> bool:
        """This rank's work is over: send the node's records now if this rank is (or can
        become) the relay, then give the role up; True when it sent them. Otherwise a
        relay still working elsewhere on the node sends them at its next tick; the last
        rank to leave always can."""
        if os.getpid() != self.pid:
            return False
        with self._lock:
            if not self.held:
                self._take()
            sent = self.held
            if sent:
                self._receive()
                self._send_records(self.node_records())
            self.release()
            return sent

    def node_records(self) -> list[dict[str, str]]:
        """Every record in the node directory."""
        records = []
        try:
            files = list((self.local / p.PROGRESS).iterdir())
        except OSError:
            files = []
        for path in files:
            if not path.name.startswith("."):      # atomic_write's temporary files
                record = p.read_record(path)
                if record:
                    records.append(record)
        return records

    def release(self) -> None:
        """Give the relay role up (this rank's work is over): another rank takes it."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)     # closing the descriptor drops the lock
            self._lock_fd = None

    def close(self) -> None:
        self.release()
        self.sock.close()

    # ---- inside ----------------------------------------------------------------------------
    def _take(self) -> None:
        try:
            self.local.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.local / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        self._lock_fd, self._next_send = fd, 0.0

    def _receive(self) -> None:
        for message, _ in channel.incoming(self.sock, self.token, channel.REQUESTS):
            for name, fields in (message.get("requests") or {}).items():
                if name in REQUEST_NAMES and isinstance(fields, dict) and \
                        self._written.get(name) != fields:
                    try:
                        p.write_record(self.local / name, fields)
                        self._written[name] = fields
                    except (OSError, ValueError):
                        pass     # the reply to the next beat brings it again

    def _send_records(self, records: list[dict[str, str]]) -> None:
        if records:
            self._send(channel.records_messages(self.token, self.node, records, relay=True))

    def _send(self, datagrams: list[bytes]) -> None:
        error = ""
        for data in datagrams:
            try:
                self.sock.sendto(data, self.addr)
                self.sent += 1
            except OSError as exc:
                error = str(exc)   # the supervisor is gone or the network hiccups: next beat
        if self.sign is not None:
            self._sign(error)

    def _sign(self, error: str) -> None:
        """Sign, once, that this node's ranks send their progress (and where to); the
        supervisor reads it when none of it arrives (hpctrain.supervisor.silence)."""
        sign, self.sign = self.sign, None
        try:
            p.write_record(sign, Sign(self.node, self.addr[0], self.addr[1], self.pid,
                                      f"{self.beat_s:g}", error).fields())
        except (OSError, ValueError):
            pass    # shared storage hiccups: only the silence would go unexplained


def news(records: list[dict[str, str]]) -> tuple:
    """What the records say that the supervisor must hear at once (not steps or beats)."""
    return tuple(sorted(tuple(r.get(k, "") for k in NEWS) for r in records))


def from_env(env: Mapping[str, str], run_id: str, restart_count: int, node: str,
             beat_s: float) -> Relay | None:
    """The rank's relay when the supervisor gave a channel (port and token); else None:
    the progress records stay in the state directory, as without a supervisor."""
    addr, token = channel.address(env), env.get(channel.TOKEN, "")
    if addr is None or not token:
        return None
    local = channel.node_dir(env, run_id, restart_count, node)
    # /dev/shm is everyone's: a directory a neighbour planted under this user's name
    # could feed the ranks forged requests
    why = access.own_dir(local.parent, 0o700) or access.own_dir(local, 0o700)
    if why:
        print(f"hpctrain: not relaying progress through {local}: {why}; writing it to the "
              "job's state directory instead", file=sys.stderr, flush=True)
        return None
    state = env.get(p.STATE_DIR, "")
    try:
        return Relay(local, addr, token, node, beat_s,
                     channel.sign_path(state, restart_count, node) if state else None)
    except OSError:
        return None
