"""Peer copies of snapshots in host memory: a lost node costs at most the snapshot interval.

A snapshot (:meth:`CheckpointManager.snapshot`) lives in its rank's process: a restart in
the same process restores it, but a lost node's step restarts in new processes everywhere
(on the survivors and a spare), and the snapshot is gone with them. With peer copies on
(``$HPCTRAIN_PEER_COPIES=1``: ``[elastic] peer_copies``, on by default with spare nodes)
the snapshot's staging memory is itself mapped from the node's memory
(:mod:`hpctrain.protocol.nodemem`: a job-private directory of ``/dev/shm``, which outlives
the processes), so the rank's own copy costs nothing more; and each snapshot is sent over
the network to the rank's *partner*, a rank on another node (:func:`partners`: one node's
loss never takes both copies), which keeps it in its own node's memory. Each copy carries
the checksums the durable format uses (:mod:`hpctrain.checkpoint.peerfile`).

On a load (:meth:`PeerCopies.restore`, collective) the ranks say which copies their nodes
hold; the newest step for which every rank has one (its own, or its partner's), no older
than the newest durable checkpoint, is restored: a copy held elsewhere travels to its rank
over the checkpoint's gloo group, every copy is verified against its checksums before use,
and any missing or damaged copy sends every rank to the durable checkpoint instead.

Cost: two more copies of a rank's snapshot in host memory (its ward's, in two slots), per
snapshot its checksums and a send to the partner on a background thread, and the ward's
copy received on another (both at nice 19: they take the CPU the training leaves idle); a
snapshot cuts the last one's send short if it is still on its way (its memory is what is
sent). An async save's staged
copy is not sent: that step is durable moments later anyway.
"""

from __future__ import annotations

import hmac
import mmap
import os
import pickle
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.checkpoint import peerfile
from hpctrain.checkpoint.peerwire import Slots, header, read_header
from hpctrain.checkpoint.tree import Chunk
from hpctrain.protocol import RESTART_COUNT, RUN_ID, channel, nodemem

CONNECT_S = 10.0                      # a partner that does not accept within this: no copy
CLOSE_WAIT_S = 10.0                   # a closing manager waits this long for the last send
CUT_WARN = 20                         # sends cut short in a row before the job log says so
WHERE_MAX = 512                       # bytes of a rank's (node, port), pickled
NICE = 19                             # the sending and receiving threads' (see _background)


# ---- who keeps whose copy, which step from where (pure) -------------------------------------
def partners(hosts: Sequence[str]) -> list[int | None]:
    """Rank -> the rank that keeps its copy (``hosts[r]`` is rank r's node): the rank with
    the same local index on the next node, round the nodes; never one on its own node.
    None for every rank when the job runs on one node."""
    order = list(dict.fromkeys(hosts))
    if len(order) < 2:
        return [None] * len(hosts)
    on: dict[str, list[int]] = {h: [] for h in order}
    local: list[int] = []
    for rank, host in enumerate(hosts):
        local.append(len(on[host]))
        on[host].append(rank)
    after = {h: order[(i + 1) % len(order)] for i, h in enumerate(order)}
    return [on[after[h]][local[r] % len(on[after[h]])] for r, h in enumerate(hosts)]


def restore_plan(held: Sequence[tuple[int | None, Mapping[int, int]]],
                 durable: int | None) -> tuple[int, dict[int, int]] | None:
    """The step to restore and, per rank, the rank whose node holds its copy (itself: its
    own): the newest step every rank has a copy of, no older than the ``durable`` step.
    ``held[r]`` is (the step of rank r's own copy or None, {ward: step of its copy})."""
    holders: dict[tuple[int, int], int] = {}      # (rank, step) -> who holds it
    for rank, (own, wards) in enumerate(held):
        if own is not None:
            holders[(rank, own)] = rank
        for ward, step in wards.items():
            holders.setdefault((ward, step), rank)
    for step in sorted({step for _, step in holders}, reverse=True):
        if durable is not None and step < durable:
            break
        sources = {r: holders.get((r, step)) for r in range(len(held))}
        if all(s is not None for s in sources.values()):
            return step, sources      # type: ignore[return-value]
    return None


def assign(where: Sequence[tuple[str, int]]) -> list[bytes]:
    """Rank 0's answer to every rank's (node, port): each rank's (its partner's address,
    its wards, why there are no peer copies or ""), pickled, in rank order."""
    plan = partners([node for node, _ in where])
    why = "the job runs on one node" if plan and plan[0] is None else \
        "no progress channel token (no supervisor)" if not all(p for _, p in where) else ""
    wards: list[list[int]] = [[] for _ in where]
    for rank, partner in enumerate(plan):
        if partner is not None:
            wards[partner].append(rank)
    return [pickle.dumps((where[p] if p is not None else ("", 0), wards[r], why))
            for r, p in enumerate(plan)]


def sources_of(plan: tuple[int, dict[int, int]] | None,
               sizes: Sequence[Mapping[int, int]]) -> list[bytes]:
    """Rank 0's answer to the ranks' copies (a :func:`restore_plan`, each rank's {ward:
    size}): each rank's (the step or None, [the wards it sends their copies to], (whom to
    receive its own from, how many bytes) or None), pickled, in rank order."""
    if plan is None:
        return [pickle.dumps((None, [], None))] * len(sizes)
    step, sources = plan
    sends: list[list[int]] = [[] for _ in sizes]
    for rank, source in sources.items():
        if source != rank:
            sends[source].append(rank)
    return [pickle.dumps((step, sends[r], None if sources[r] == r else
                          (sources[r], sizes[sources[r]][r]))) for r in range(len(sizes))]


def _background() -> None:
    """This thread yields the CPU to the training's (its checksums and copies run in the
    training's idle moments, as on a GPU node's idle cores): the most a thread can lower
    its own priority without privileges."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except OSError:
        pass


# ---- one rank's copies ----------------------------------------------------------------------
class PeerCopies:
    """This rank's peer copies: its own snapshot in node memory (:meth:`allocate` maps the
    snapshot's staging there) and at its partner, and the copies it keeps for its wards.
    Made by :meth:`start`; the manager calls :meth:`before_stage` and :meth:`put` around
    each snapshot, and :meth:`restore` on a load."""

    def __init__(self, comm: Any, directory: Path, partner: tuple[str, int], wards: set[int],
                 token: str, server: socket.socket) -> None:
        # the manager's group: given back at close (a group still referenced outlives its
        # attempt, and its connections keep a peer waiting: hpctrain.runtime.groups)
        self.comm, self.dir, self.partner, self.wards = comm, directory, partner, wards
        self.rank = comm.rank
        self.token, self.server = token, server
        self.data, self.meta = directory / f"{comm.rank}.data", directory / f"{comm.rank}.meta"
        self._cond = threading.Condition()
        self._pending: tuple[int, Sequence[Chunk], bytes] | None = None
        self._busy = self._closed = False
        self._sending = False                   # the send's part of the busy time
        self._cut = 0                           # sends cut short by a newer snapshot in a row
        self.puts = self.sent = 0               # snapshots put, and sent whole to the partner
        self._pages: mmap.mmap | None = None    # the snapshot's staging, in node memory
        self._sock: socket.socket | None = None
        self.failures: list[str] = []           # each kind of failure, said once
        threading.Thread(target=self._serve, name="hpctrain-peer-in", daemon=True).start()
        threading.Thread(target=self._send_loop, name="hpctrain-peer-out",
                         daemon=True).start()

    @classmethod
    def start(cls, comm: Any, env: Mapping[str, str] = os.environ) -> PeerCopies | None:
        """This rank's peer copies when ``$HPCTRAIN_PEER_COPIES`` asks for them and the job
        spans nodes (collective: every rank says where it listens), else None."""
        if env.get(nodemem.PEER_COPIES) != "1" or not comm.active:
            return None
        token = env.get(channel.TOKEN, "")
        node = env.get("SLURMD_NODENAME") or socket.gethostname()
        server = socket.create_server(("", 0)) if token else None
        port = server.getsockname()[1] if server is not None else 0
        # rank 0 pairs them: a gather of (node, port), each rank its own part back (its
        # partner's address, its wards), O(1) bytes a rank whatever the world
        gathered = comm.gather_bytes(pickle.dumps((node, port)), size=WHERE_MAX)
        parts = None if gathered is None else assign([pickle.loads(g) for g in gathered])
        partner, wards, why = pickle.loads(comm.scatter_bytes(parts))
        if why:
            if server is not None:
                server.close()
            if comm.rank == 0:
                print(f"hpctrain: peer copies of snapshots off: {why}", file=sys.stderr,
                      flush=True)
            return None
        directory = nodemem.peer_dir(env, env.get(RUN_ID, "run"),
                                     int(env.get(RESTART_COUNT, "0") or 0), node)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        assert server is not None
        return cls(comm, directory, tuple(partner), set(wards), token, server)

    # ---- a snapshot: kept in node memory, sent to the partner -----------------------------
    def allocate(self, nbytes: int) -> torch.Tensor:
        """The snapshot's staging memory (``nbytes``), mapped from this node's memory."""
        fd = os.open(self.data, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # never shorter: a mapping made for the last layout may still be read (a kept
            # snapshot), and pages past the file's end would fault
            os.ftruncate(fd, max(nbytes, os.fstat(fd).st_size, 1))
            self._pages = mmap.mmap(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        return torch.frombuffer(self._pages, dtype=torch.uint8)[:nbytes]

    def before_stage(self) -> None:
        """Before the staging memory is written again: the last snapshot's checksums taken;
        a send of it still on its way is cut short (the newer snapshot replaces it: the
        training never waits for the network; the partner keeps the copy before it), and
        the own copy spoiled until the new one is whole."""
        with self._cond:
            if self._sending and self._sock is not None:
                self._sock.shutdown(socket.SHUT_RDWR)
                self._cut += 1
                if self._cut == CUT_WARN:
                    self._fail(f"{CUT_WARN} snapshots in a row came before the last one had "
                               f"reached the partner (peer copies fall behind: snapshot "
                               f"less often)")
            self._cond.wait_for(lambda: self._pending is None and not self._busy)
        self.meta.unlink(missing_ok=True)

    def put(self, step: int, chunks: Sequence[Chunk], extras: bytes) -> None:
        """``chunks`` (staged in :meth:`allocate`'s memory) and the pickled ``extras`` are
        the snapshot of ``step``: its checksums and its send follow on the background
        thread."""
        with self._cond:
            self._pending = (step, chunks, extras)
            self.puts += 1
            self._cond.notify_all()

    def _send_loop(self) -> None:
        _background()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:      # closed, nothing left to send
                    break
                step, chunks, extras = self._pending
                self._pending, self._busy = None, True
            try:
                self._keep_and_send(step, chunks, extras)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        if self._sock is not None:
            self._sock.close()

    def _keep_and_send(self, step: int, chunks: Sequence[Chunk], extras: bytes) -> None:
        if self._pages is None:
            return
        data = np.frombuffer(self._pages, dtype=np.uint8)
        end = peerfile.tail(self.rank, step, chunks, data, extras)
        size = peerfile.meta_of(end)["data_size"]    # type: ignore[index]
        try:
            tmp = self.meta.with_name(self.meta.name + ".tmp")
            tmp.write_bytes(end)
            os.replace(tmp, self.meta)
        except OSError as exc:
            return self._fail(f"could not keep step {step} in node memory ({exc})")
        try:
            if self._sock is None:
                self._sock = socket.create_connection(self.partner, timeout=CONNECT_S)
                self._sock.settimeout(None)
            with self._cond:
                self._sending = True
            self._sock.sendall(header(self.token, self.rank, size + len(end)))
            self._sock.sendall(memoryview(self._pages)[:size])
            self._sock.sendall(end)
            self._cut = 0
            self.sent += 1
        except OSError as exc:
            if not self._cut:       # (cut short by the next snapshot: nothing to say)
                self._fail(f"could not send the copy to {self.partner[0]}:"
                           f"{self.partner[1]} ({exc})")
            if self._sock is not None:
                self._sock.close()
                self._sock = None
        finally:
            with self._cond:
                self._sending = False

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._receive, args=(conn,), daemon=True,
                             name="hpctrain-peer-recv").start()

    def _receive(self, conn: socket.socket) -> None:
        """Copies from one ward, as they come, each into the older of the ward's two slots
        (the newer one stays whole while the next arrives), straight into its pages."""
        _background()
        with conn, closing(Slots()) as slots:
            while True:
                head = read_header(conn)
                if head is None or not hmac.compare_digest(
                        str(head.get("token", "")), self.token) or head["rank"] not in self.wards:
                    break            # closed, or not a ward of this job's
                older = min(self._slots(head["rank"]),
                            key=lambda sm: sm[1]["step"] if sm[1] else -1)[0]
                if not slots.receive(conn, older, head["nbytes"]):
                    break

    def _slots(self, ward: int) -> list[tuple[Path, dict | None]]:
        return [(s, peerfile.read_meta(s)) for s in (self.dir / f"{ward}.{n}.copy"
                                                      for n in "ab")]

    def _fail(self, what: str) -> None:
        kind = what.split(" (")[0]
        if kind not in self.failures:
            self.failures.append(kind)
            print(f"hpctrain: rank {self.rank}: peer copy: {what}; the durable "
                  "checkpoint still stands", file=sys.stderr, flush=True)

    # ---- a load ---------------------------------------------------------------------------
    def held(self) -> tuple[int | None, dict[int, int], dict[int, int]]:
        """(the step of this rank's own copy, {ward: step}, {ward: size}) in node memory."""
        own = peerfile.read_meta(self.meta)
        steps, sizes = {}, {}
        for ward in self.wards:
            meta = max((m for _, m in self._slots(ward) if m), default=None,
                       key=lambda m: m["step"])
            if meta is not None:
                steps[ward], sizes[ward] = meta["step"], meta["size"]
        return (own["step"] if own else None), steps, sizes

    def restore(self, state: dict, durable: int | None, unpickle_mode: str) -> int | None:
        """Collective: the step restored into ``state`` from the copies in node memory on
        every rank, or None (the caller reads the durable checkpoint)."""
        import torch.distributed as dist

        # rank 0 decides: a gather of what each node holds (a few numbers a rank), each
        # rank its own part back: the step, what to send, what to receive
        held = pickle.dumps(self.held())
        gathered = self.comm.gather_bytes(held)
        parts = None
        if gathered is not None:
            every = [pickle.loads(g) for g in gathered]
            parts = sources_of(restore_plan([(o, s) for o, s, _ in every], durable),
                               [z for _, _, z in every])
        step, sends, receive = pickle.loads(self.comm.scatter_bytes(parts))
        if step is None:
            return None
        ops, got = [], None
        for ward in sends:
            path = next(p for p, m in self._slots(ward) if m and m["step"] == step)
            ops.append(dist.P2POp(dist.isend, torch.from_numpy(np.fromfile(path, np.uint8)),
                                  self.comm._global(ward), group=self.comm.group))
        if receive is not None:
            got = torch.empty(receive[1], dtype=torch.uint8)
            ops.append(dist.P2POp(dist.irecv, got, self.comm._global(receive[0]),
                                  group=self.comm.group))
        for request in dist.batch_isend_irecv(ops) if ops else ():
            request.wait()
        if got is None:
            data, end = np.fromfile(self.data, np.uint8), np.fromfile(self.meta, np.uint8)
        else:
            blob = got.numpy()
            cut = (peerfile.meta_of(blob) or {}).get("data_size", 0)
            data, end = blob[:cut], blob[cut:]
        why = peerfile.restore(data, end, state, unpickle_mode)
        if why:
            print(f"hpctrain: rank {self.rank}: not restoring step {step} from a peer copy: "
                  f"{why}", file=sys.stderr, flush=True)
        return None if self.comm.all_reduce_max([1 if why else 0])[0] else step

    def forget_others(self, step: int | None) -> None:
        """Drop the copies of any step but ``step`` (after a load: a copy of another step is
        of another past; the training goes on from ``step``)."""
        for path in [self.meta, *self.dir.glob("*.*.copy")]:
            meta = peerfile.read_meta(path)
            if meta is None or meta["step"] != step:
                path.unlink(missing_ok=True)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout`` seconds) until the last snapshot put has been sent or
        given up; whether it has."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy,
                                       timeout=timeout)

    def close(self) -> None:
        """Stop sending (the last copy sent first, for up to CLOSE_WAIT_S) and receiving;
        the copies stay in node memory for a restart."""
        self.flush(CLOSE_WAIT_S)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.server.close()
        self.comm = None       # the receiving threads outlive this: they must not hold it
