"""The progress channel gone silent: ranks that send their progress (UDP,
:mod:`hpctrain.protocol.channel`) and none of it arrives, because a firewall between the
compute nodes drops UDP or the ranks send to an address that is not this node's.

Each node's relay signs once, on shared storage, that its ranks send and where to
(:func:`hpctrain.protocol.channel.sign_path`); a script that sends nothing leaves no sign, so
the two are never confused. A node whose sign has stood for UNHEARD_BEATS heartbeats (at
least UNHEARD_MIN_S) without one datagram of its ranks reaching the board is silent: the job
log says so once (the nodes, where they send, this node and its UDP port, the port range
to allow) and hang detection falls back to what still works: the records the ranks of
*this* node (the batch node runs ranks of its own) keep on its local disk beside the
datagrams, read here as the relay reads them; without any, the job log's growth. Stack
requests and in-process restarts need the channel and are not available meanwhile: a hang
restarts the step in new processes.

The sign directory is looked at every beat for the step's first EARLY_S, then every
LATE_S, and not at all once every node of the step has been heard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from hpctrain import access
from hpctrain import protocol as p
from hpctrain.protocol import channel
from hpctrain.protocol.dialog import Attempt
from hpctrain.protocol.progress import Progress
from hpctrain.protocol.records import Sign

UNHEARD_BEATS = 5        # a node signed this many beats ago and none of its datagrams came
UNHEARD_MIN_S = 10.0     # ...nor in this long
EARLY_S, LATE_S = 120.0, 30.0     # how long to look every beat, then how often
PORT_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def unheard_nodes(first_seen: Mapping[str, float], heard: Iterable[str], now: float,
                 beat_s: float) -> tuple[str, ...]:
    """The nodes whose sign was first seen (``first_seen``, a monotonic time each) at least
    UNHEARD_BEATS beats (UNHEARD_MIN_S) before ``now`` and none of whose ranks was heard."""
    quiet = max(UNHEARD_BEATS * beat_s, UNHEARD_MIN_S)
    got = set(heard)
    return tuple(sorted(n for n, at in first_seen.items() if n not in got and now - at >= quiet))


def message(nodes: tuple[str, ...], signs: Mapping[str, Sign], here: str,
            port: int, ports: str, waited_s: float, fallback: str) -> str:
    """The job log's line about ``nodes`` gone silent (their ``signs``), for the board on
    node ``here``, UDP ``port`` (taken from the ephemeral range ``ports``)."""
    sent = sorted({f"{s.host or '?'}:{'?' if s.port is None else s.port}"
                   for n, s in signs.items() if n in nodes})
    errors = sorted({s.error for n, s in signs.items() if n in nodes and s.error})
    beat = next((s.beat_s for n, s in signs.items() if n in nodes), "") or "?"
    failed = f"; sending failed: {'; '.join(errors)}" if errors else ""
    return (f"no progress datagram from the ranks on {','.join(nodes)} has reached the "
            f"supervisor on {here or 'this node'} (UDP port {port}) in {waited_s:.0f} s, "
            f"though they send one every {beat} s (to {', '.join(sent)}{failed}): UDP "
            f"between the compute nodes is blocked. Allow UDP from the partition's nodes to "
            f"{here or 'the batch node'}, ports {ports} (the supervisor takes an ephemeral "
            f"port each run; docs/site.md). Meanwhile hang detection watches {fallback}")


class Silence:
    """One run's watch on the progress channel (its attempts share it)."""

    def __init__(self, state_dir: Path, run_id: str, restart_count: int, beat_s: float,
                 node: str, port: int, env: Mapping[str, str]) -> None:
        self.state_dir, self.run_id, self.restart_count = state_dir, run_id, restart_count
        self.beat_s, self.node, self.port = beat_s, node, port
        self.local = channel.node_dir(env, run_id, restart_count, node)
        self.started: float | None = None         # the first look (a monotonic time)
        self._next = 0.0
        self.first_seen: dict[str, float] = {}     # node -> when its sign was first seen
        self.signs: dict[str, Sign] = {}
        self.heard: set[str] = set()               # nodes whose ranks' datagrams arrived
        self.silent: tuple[str, ...] = ()          # said in the job log already
        self._forget_earlier_runs()

    @property
    def on(self) -> bool:
        """Has some node gone silent (the fallback is on)?"""
        return bool(self.silent)

    def look(self, heard: Iterable[str], step_nodes: int, now: float) -> str:
        """At most every beat early on (then every LATE_S): nodes newly silent, given the
        nodes the board has heard in this run and the monotonic clock ``now``; the job
        log's line about them, else ''."""
        self.heard.update(heard)
        if now < self._next or len(self.heard) >= step_nodes:
            return ""
        self.started = now if self.started is None else self.started
        self._next = now + (max(self.beat_s, 1.0) if now - self.started < EARLY_S else LATE_S)
        for node, sign in self._signs().items():
            self.first_seen.setdefault(node, now)
            self.signs[node] = sign
        new = tuple(n for n in unheard_nodes(self.first_seen, self.heard, now, self.beat_s)
                    if n not in self.silent)
        if not new:
            return ""
        self.silent = tuple(sorted({*self.silent, *new}))
        waited = now - min(self.first_seen[n] for n in new)
        return message(new, self.signs, self.node, self.port, _port_range(),
                       waited, self.fallback())

    def fallback(self) -> str:
        """What hang detection watches while the channel is silent, in words."""
        local = self.local_records()
        if local:
            ranks = ",".join(map(str, sorted(local)))
            return (f"the records rank(s) {ranks} keep on this node's local disk "
                    f"({self.local})")
        return "the job log's growth (no rank of this node keeps a record on its disk)"

    def local_records(self, attempt: Attempt | None = None) -> dict[int, Progress]:
        """The progress records on this node's local disk (of ``attempt`` when given), by
        rank; a directory that is not this user's own is not read."""
        records: dict[int, Progress] = {}
        try:
            # node-local memory is everyone's: a directory a neighbour planted is not read
            if any(access.unsafe_reason(d) for d in (self.local.parent, self.local)):
                return {}
            files = list((self.local / p.PROGRESS).iterdir())
        except OSError:
            return {}
        for path in files:
            if path.name.startswith("."):
                continue                  # atomic_write's temporary files
            record = Progress.parse(p.read_record(path))
            if record is not None and (attempt is None or record.address == attempt) and \
                    record.address.run_id == self.run_id:
                records[record.rank] = record
        return records

    def _signs(self) -> dict[str, Sign]:
        prefix = f"r{self.restart_count}-"
        try:
            paths = list((self.state_dir / channel.SIGNS).iterdir())
        except OSError:
            return {}
        out = {}
        for path in paths:
            if path.name.startswith(prefix):
                sign = Sign.parse(p.read_record(path))
                if sign is not None and sign.node:
                    out[sign.node] = sign
        return out

    def _forget_earlier_runs(self) -> None:
        """Earlier runs' signs go: one small file per node per run would pile up."""
        try:
            for path in (self.state_dir / channel.SIGNS).iterdir():
                if not path.name.startswith(f"r{self.restart_count}-"):
                    path.unlink(missing_ok=True)
        except OSError:
            pass


def _port_range() -> str:
    """The ephemeral port range the board's port comes from (net.ipv4.ip_local_port_range)."""
    try:
        low, high = Path(PORT_RANGE).read_text().split()
        return f"{low}-{high}"
    except (OSError, ValueError):
        return "32768-60999"    # Linux's default
