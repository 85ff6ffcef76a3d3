"""The supervisor's end of the progress channel (:mod:`hpctrain.protocol.channel`): a UDP
port the nodes' relays send the ranks' records to, the newest record of each rank kept in
memory, and the supervisor's requests to the ranks (stacks, leave the attempt, go on)
pushed to every relay and repeated in the reply to each of its messages while they stand.

Its work per look is one datagram per node per heartbeat, whatever the ranks per node; no
file on shared storage is read or written for it. ``hpctrain status`` asks the supervisor
for rank 0's newest record here (:mod:`hpctrain.supervisor.live`), and reads a summary the
supervisor writes every SUMMARY_S (:meth:`hpctrain.supervisor.hang.Watch.summarize`) when
it cannot.
"""

from __future__ import annotations

import secrets
import select
import socket
import threading
from typing import Any

from hpctrain.protocol import channel
from hpctrain.protocol.dialog import Interrupt, Resume, StackRequest
from hpctrain.protocol.progress import Progress

BUFFER = 8 << 20      # receive buffer: a burst of every rank's last word (8,192 x ~300 B)
SUMMARY_S = 15.0      # how often the summary (status's fallback) may be rewritten


class Board:
    """The ranks' newest records, parsed once as they arrive (:class:`Progress`)."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self.sock = channel.udp_socket(("0.0.0.0", 0), BUFFER)
        self.port = self.sock.getsockname()[1]
        self._latest: dict[int, Progress] = {}
        self._relays: set[tuple[str, int]] = set()
        self._requests: dict[str, dict[str, str]] = {}
        self.received = 0       # datagrams taken (the traffic figures in docs/scale.md)
        # a thread takes datagrams as they come, so a burst (every node's last word at
        # once) is not left to overflow the socket's buffer between the supervisor's looks
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="hpctrain-board",
                                        daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        """What the step's ranks need to reach the board."""
        return {channel.PORT: str(self.port), channel.TOKEN: self.token}

    def records(self) -> dict[int, Progress]:
        """Every rank's newest record (any run or attempt: the caller picks), by rank."""
        self.drain()
        with self._lock:
            return dict(self._latest)

    def drain(self) -> None:
        """Take every datagram waiting; answer a relay's with the standing requests."""
        with self._lock:
            self._drain()

    def _listen(self) -> None:
        while not self._closed.is_set():
            try:
                ready, _, _ = select.select([self.sock], [], [], 0.5)
            except (OSError, ValueError):
                return      # closed
            if ready:
                self.drain()

    def _drain(self) -> None:
        for message, sender in channel.incoming(self.sock, self.token, channel.RECORDS):
            self.received += 1
            self._take(message.get("records") or [])
            if message.get("relay"):
                self._relays.add(sender)
                if self._requests:
                    self._send(sender)

    def request(self, name: str, fields: dict[str, Any]) -> None:
        """Stand request ``name`` (``dump``, ``interrupt``, ``resume``) and push it to every
        node's relay now; it is repeated in the reply to each relay message until cleared."""
        with self._lock:
            self._requests[name] = {k: str(v) for k, v in fields.items()}
            for relay in self._relays:
                self._send(relay)

    def ask(self, request: StackRequest | Interrupt | Resume) -> None:
        """Stand a typed request (:mod:`hpctrain.protocol.dialog`) for the ranks."""
        self.request(request.name, request.record())

    def clear(self, *names: str) -> None:
        with self._lock:
            for name in names:
                self._requests.pop(name, None)

    def buffer_bytes(self) -> int:
        """The receive buffer the kernel granted (net.core.rmem_max caps the ask)."""
        return self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

    def buffer_note(self, world: int) -> str:
        """What to tell the job log when every rank's last word at once may not fit."""
        return buffer_note(self.buffer_bytes(), world)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2.0)
        self.sock.close()

    def _take(self, records: list[Any]) -> None:
        for fields in records:
            record = Progress.parse(fields) if isinstance(fields, dict) else None
            if record is None:
                continue      # not a record: a stray or damaged datagram
            known = self._latest.get(record.rank)
            if known is None or record.newer_than(known):
                self._latest[record.rank] = record

    def _send(self, relay: tuple[str, int]) -> None:
        try:
            self.sock.sendto(channel.encode(self.token, channel.REQUESTS,
                                            requests=self._requests), relay)
        except OSError:
            pass     # the relay's next message brings another reply


PER_WORD = 1024      # what one rank's last word takes of the buffer (datagram + kernel's)


def buffer_note(granted: int, world: int) -> str:
    """'' when ``world`` ranks' last words fit in ``granted`` bytes; else what to do."""
    if granted >= world * PER_WORD:
        return ""
    return (f"the progress board's receive buffer is {granted >> 10} KiB "
            f"(net.core.rmem_max caps it): {world} ranks' last words at once may not all "
            f"fit, and a lost one leaves the end judged by Slurm's word alone; raise "
            f"net.core.rmem_max to {world * PER_WORD >> 20 or 1} MiB or more "
            "(docs/scale.md)")
