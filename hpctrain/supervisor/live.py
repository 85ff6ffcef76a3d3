"""The supervisor's end of the live query (:mod:`hpctrain.protocol.live`): a UDP port on
the batch node that answers ``hpctrain status`` with rank 0's newest progress record, as
the progress board holds it (:mod:`hpctrain.supervisor.board`: at most a heartbeat old,
whatever the job's size).

It costs shared storage one file for the run (the ``live`` record: its address and
secret, written at the start and removed at the end); each answer is one datagram from
memory. The summary file (:meth:`hpctrain.supervisor.hang.Watch.summarize`) stays what
``status`` reads when this port cannot be reached.
"""

from __future__ import annotations

import select
import socket
import threading
import time

from hpctrain import protocol
from hpctrain.protocol import live
from hpctrain.supervisor.board import SUMMARY_S, Board
from hpctrain.supervisor.statedir import StateDir

LOOK_S = 0.5     # how often the thread looks whether it must stop


class LiveServer:
    """Answers the job's own user's ``status`` from the board, on its own thread."""

    def __init__(self, state: StateDir, key: str, restart_count: int, board: Board,
                 node: str = "") -> None:
        self.state, self.board, self.restart_count = state, board, restart_count
        host = node or socket.gethostname()
        self.sock = _bound(host)
        self.address = live.Address(key, state.run_id, restart_count, host,
                                    self.sock.getsockname()[1], live.new_secret())
        self.answered = 0          # answers sent (a test's and a benchmark's figure)
        self._seen: dict[str, float] = {}
        self._closed = threading.Event()
        try:
            live.write_address(state.path, self.address)
        except OSError:
            self.sock.close()
            raise
        self._thread = threading.Thread(target=self._serve, name="hpctrain-live", daemon=True)
        self._thread.start()

    def current(self) -> dict[str, str]:
        """Rank 0's newest record of this run (any attempt); {} before it said anything."""
        record = self.board.records().get(0)
        if record is None or record.address.run_id != self.state.run_id or \
                record.address.restart_count != self.restart_count:
            return {}
        return record.fields()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                ready, _, _ = select.select([self.sock], [], [], LOOK_S)
            except (OSError, ValueError):
                return      # closed
            if ready:
                self._answer_waiting()

    def _answer_waiting(self) -> None:
        while True:
            try:
                data, sender = self.sock.recvfrom(1024)   # a request is ~250 bytes
            except OSError:
                return      # nothing more waiting
            now = time.time()
            nonce = live.checked_request(self.address, data, now, self._seen)
            if nonce is None:
                continue    # not the job's user's (or played again): no answer at all
            try:
                self.sock.sendto(live.answer(self.address, nonce, self.current(), now), sender)
                self.answered += 1
            except OSError:
                pass        # the asker gone: it falls back to the summary

    def close(self) -> None:
        """Stop answering, and remove the ``live`` record when it is still this run's (a
        later run of the job may have written its own), so ``status`` reads the summary
        at once rather than wait for a port that is gone."""
        self._closed.set()
        self._thread.join(timeout=2.0)
        self.sock.close()
        path = self.state.file(protocol.LIVE)
        if live.read_address(self.state.path) == self.address:
            path.unlink(missing_ok=True)


def _bound(host: str) -> socket.socket:
    """A UDP socket on the address ``host`` resolves to here (on the devcluster, loopback:
    nothing else reaches it), else on every address of the node; a port the kernel picks."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    try:
        sock.bind((socket.gethostbyname(host), 0))
    except OSError:      # not resolvable here, or not an address of this node
        sock.bind(("0.0.0.0", 0))
    return sock


def start(state: StateDir, key: str, restart_count: int, board: Board,
          node: str = "") -> tuple[LiveServer | None, str]:
    """The server, or None and what to tell the job log (``status`` then reads the summary
    file, which the supervisor keeps whether or not anyone can ask it)."""
    try:
        return LiveServer(state, key, restart_count, board, node), ""
    except OSError as exc:
        return None, (f"hpctrain status will show the progress summary (up to {SUMMARY_S:.0f} s "
                      f"old): the live query could not start ({exc})")
