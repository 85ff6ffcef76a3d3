"""Peer copies of snapshots in host memory: a lost node costs at most the snapshot interval.

A snapshot (:meth:`CheckpointManager.snapshot`, or an async save's staged copy) lives in
its rank's process: a restart in the same process restores it, but a lost node's step
restarts in new processes everywhere (on the survivors and a spare), and the snapshot is
gone with them. With peer copies on (``$HPCTRAIN_PEER_COPIES=1``: ``[elastic]
peer_copies``, on by default with spare nodes) each rank also keeps its newest snapshot in
its node's memory (:mod:`hpctrain.protocol.nodemem`: a job-private directory of
``/dev/shm``, which outlives the processes) and sends a copy over the network to its
*partner*, a rank on another node (:func:`partners`: one node's loss never takes both
copies), which keeps it in its own node's memory. Each copy carries the checksums the
durable format uses.

On a load (:meth:`PeerCopies.restore`, collective) the ranks say which copies their nodes
hold; the newest step for which every rank has one (its own, or its partner's), no older
than the newest durable checkpoint, is restored: a copy held elsewhere travels to its rank
over the checkpoint's gloo group, every copy is verified against its checksums before use,
and any missing or damaged copy sends every rank to the durable checkpoint instead.

Cost: two more copies of a rank's snapshot in host memory (its own in node memory and its
ward's), and per snapshot a copy into node memory, its checksums and a send to the partner,
all on a background thread (the loop waits only when a snapshot comes before the last one
is written down).
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import struct
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.checkpoint import checksum, unpickle
from hpctrain.checkpoint.tree import (Chunk, as_bytes, dtype_from_name, dtype_name,
                                      flatten, set_path)
from hpctrain.protocol import channel, nodemem
from hpctrain.protocol import RESTART_COUNT, RUN_ID

MAGIC = b"HPCTPEER"
TRAILER = struct.Struct("<Q8s")       # the meta's length, MAGIC: the file's last 16 bytes
CONNECT_S = 10.0                      # a partner that does not accept within this: no copy
CLOSE_WAIT_S = 10.0                   # a closing manager waits this long for the last send
BLOCK = 4 << 20                       # bytes received per read


# ---- who keeps whose copy (pure) ------------------------------------------------------------
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
    steps = sorted({step for _, step in holders}, reverse=True)
    for step in steps:
        if durable is not None and step < durable:
            break
        sources = {r: holders.get((r, step)) for r in range(len(held))}
        if all(s is not None for s in sources.values()):
            return step, sources      # type: ignore[return-value]
    return None


# ---- one copy: a file in node memory --------------------------------------------------------
def layout(c: Chunk) -> list:
    """A chunk's place in the state, as a copy's meta records it (JSON)."""
    return [list(c.path), list(c.offsets), list(c.shape), dtype_name(c.dtype),
            list(c.global_shape)]


def write_copy(path: Path, rank: int, step: int, chunks: Sequence[Chunk],
               extras: bytes) -> int:
    """Write one rank's snapshot as a copy file (its bytes, then a meta with the checksums),
    atomically (a reader never sees half of one); its size."""
    algorithm = checksum.DEFAULT
    fn = checksum.get(algorithm)
    tmp = path.with_name(path.name + ".tmp")
    metas = []
    with open(tmp, "wb") as fh:
        for c in chunks:
            data = as_bytes(c.local).numpy()     # a staged chunk: its bytes, as uint8
            fh.write(memoryview(data).cast("B"))
            metas.append([*layout(c), data.nbytes, fn(data)])
        fh.write(extras)
        meta = json.dumps({"rank": rank, "step": step, "algorithm": algorithm,
                           "chunks": metas, "extras": [len(extras), fn(extras)]}).encode()
        fh.write(meta)
        fh.write(TRAILER.pack(len(meta), MAGIC))
        size = fh.tell()
    os.replace(tmp, path)
    return size


def read_meta(path: Path) -> dict | None:
    """A copy file's meta (with its ``size``), or None when it is not a whole copy."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size < TRAILER.size:
                return None
            fh.seek(size - TRAILER.size)
            length, magic = TRAILER.unpack(fh.read(TRAILER.size))
            if magic != MAGIC or length > size - TRAILER.size:
                return None
            fh.seek(size - TRAILER.size - length)
            meta = json.loads(fh.read(length))
    except (OSError, ValueError):
        return None
    return {**meta, "size": size} if isinstance(meta, dict) and "step" in meta else None


def restore_copy(blob: np.ndarray, state: dict, unpickle_mode: str) -> str:
    """Verify a copy (``blob``: the file's bytes) and copy it into ``state`` in place; ""
    when done, else why not (``state`` untouched: laid out otherwise, or damaged). Values
    the copy holds and ``state`` lacks are added (a fresh optimizer's moments), as a load
    from storage adds them; a value of ``state`` the copy lacks is refused."""
    meta = _meta_of(blob)
    if meta is None:
        return "not a whole copy"
    fn = checksum.get(meta["algorithm"])
    offset, pieces = 0, {}
    for m in meta["chunks"]:
        piece = blob[offset:offset + m[5]]
        if fn(piece) != m[6]:
            return f"checksum mismatch in {m[0]}"
        pieces[_key(m[0], m[1])] = (m, piece)
        offset += m[5]
    extras = blob[offset:offset + meta["extras"][0]]
    if fn(extras) != meta["extras"][1]:
        return "checksum mismatch in the extras"
    chunks, _ = flatten(state)
    if any(pieces.get(_key(*layout(c)[:2]), ([],))[0][:5] != layout(c) for c in chunks):
        return "the state is laid out otherwise"
    added = dict(pieces)
    for c in chunks:
        m, piece = added.pop(_key(*layout(c)[:2]))
        if c.nbytes:
            c.local.copy_(torch.from_numpy(piece).view(c.dtype).view(c.shape))
    if any(m[2] != m[4] for m, _ in added.values()):
        return "the state is laid out otherwise (a shard the state does not hold)"
    for m, piece in added.values():
        value = torch.from_numpy(piece.copy()).view(dtype_from_name(m[3])).view(m[2])
        set_path(state, tuple(m[0]), value)
    for where, value in unpickle.loads(extras.tobytes(), "a peer copy's extras",
                                       unpickle_mode).items():
        set_path(state, where, value)
    return ""


def _key(path: list, offsets: list) -> str:
    return json.dumps([list(path), list(offsets)])


def _meta_of(blob: np.ndarray) -> dict | None:
    if blob.size < TRAILER.size:
        return None
    length, magic = TRAILER.unpack(blob[-TRAILER.size:].tobytes())
    if magic != MAGIC or length > blob.size - TRAILER.size:
        return None
    try:
        return json.loads(blob[-TRAILER.size - length:-TRAILER.size].tobytes())
    except ValueError:
        return None


# ---- one rank's copies ----------------------------------------------------------------------
class PeerCopies:
    """This rank's peer copies: its own snapshot in node memory and at its partner, and the
    copies it keeps for its wards. Made by :meth:`start`; every rank then calls
    :meth:`put` with each snapshot and :meth:`restore` on a load."""

    def __init__(self, comm: Any, directory: Path, partner: tuple[str, int], wards: set[int],
                 token: str, server: socket.socket) -> None:
        self.comm, self.dir, self.partner, self.wards = comm, directory, partner, wards
        self.token, self.server = token, server
        self.own = directory / f"{comm.rank}.snap"
        self._cond = threading.Condition()
        self._pending: tuple[int, Sequence[Chunk], bytes] | None = None
        self._writing = self._sending = False
        self._closed = False
        self._sock: socket.socket | None = None
        self.failures: list[str] = []        # each kind of failure, said once
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
        where = comm.all_gather((node, port))
        plan = partners([n for n, _ in where])
        mine = plan[comm.rank]
        if mine is None or not all(p for _, p in where):
            if server is not None:
                server.close()
            if comm.rank == 0:
                why = "the job runs on one node" if mine is None else \
                    "no progress channel token (no supervisor)"
                print(f"hpctrain: peer copies of snapshots off: {why}", file=sys.stderr,
                      flush=True)
            return None
        directory = nodemem.peer_dir(env, env.get(RUN_ID, "run"),
                                     int(env.get(RESTART_COUNT, "0") or 0), node)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        wards = {r for r, p in enumerate(plan) if p == comm.rank}
        assert server is not None
        return cls(comm, directory, where[mine], wards, token, server)

    # ---- a snapshot, kept and sent --------------------------------------------------------
    def put(self, step: int, chunks: Sequence[Chunk], extras: bytes) -> None:
        """Keep ``step`` (the staged ``chunks``, the pickled ``extras``) in node memory and
        send it to the partner, on the background thread. The chunks' buffers must not
        change until :meth:`wait_written` returns."""
        with self._cond:
            self._pending = (step, chunks, extras)
            self._cond.notify_all()

    def wait_written(self) -> None:
        """Until the last snapshot is in node memory (its buffers may then be reused)."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is None and not self._writing)

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:      # closed, nothing left to send
                    break
                step, chunks, extras = self._pending
                self._pending, self._writing, self._sending = None, True, True
            try:
                size = write_copy(self.own, self.comm.rank, step, chunks, extras)
            except OSError as exc:
                self._fail(f"could not keep step {step} in node memory ({exc})")
                size = 0
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()
            if size:
                self._send(size)
            with self._cond:
                self._sending = False
                self._cond.notify_all()
        if self._sock is not None:
            self._sock.close()

    def _send(self, size: int) -> None:
        header = json.dumps({"token": self.token, "rank": self.comm.rank,
                             "nbytes": size}).encode() + b"\n"
        try:
            if self._sock is None:
                self._sock = socket.create_connection(self.partner, timeout=CONNECT_S)
                self._sock.settimeout(None)
            self._sock.sendall(header)
            with open(self.own, "rb") as fh:
                sent = 0
                while sent < size:
                    sent += os.sendfile(self._sock.fileno(), fh.fileno(), sent, size - sent)
        except OSError as exc:
            self._fail(f"could not send the copy to {self.partner[0]}:{self.partner[1]} "
                       f"({exc})")
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._receive, args=(conn,), daemon=True,
                             name="hpctrain-peer-recv").start()

    def _receive(self, conn: socket.socket) -> None:
        """Copies from one ward, as they come: each into a temporary file, then in place."""
        with conn, conn.makefile("rb") as stream:
            while True:
                line = stream.readline(4096)
                try:
                    head = json.loads(line)
                    ward, size = int(head["rank"]), int(head["nbytes"])
                except (ValueError, KeyError, TypeError):
                    return           # closed, or not a ward of this job's
                if not hmac.compare_digest(str(head.get("token", "")), self.token) or \
                        ward not in self.wards:
                    return
                path = self.dir / f"{ward}.copy"
                tmp = path.with_name(path.name + ".tmp")
                with open(tmp, "wb") as out:
                    left = size
                    while left:
                        block = stream.read(min(BLOCK, left))
                        if not block:
                            return
                        out.write(block)
                        left -= len(block)
                if read_meta(tmp) is not None:
                    os.replace(tmp, path)

    def _fail(self, what: str) -> None:
        kind = what.split(" (")[0]
        if kind not in self.failures:
            self.failures.append(kind)
            print(f"hpctrain: rank {self.comm.rank}: peer copy: {what}; the durable "
                  "checkpoint still stands", file=sys.stderr, flush=True)

    # ---- a load ---------------------------------------------------------------------------
    def held(self) -> tuple[int | None, dict[int, int], dict[int, int]]:
        """(the step of this rank's own copy, {ward: step}, {ward: size}) in node memory."""
        own = read_meta(self.own)
        steps, sizes = {}, {}
        for path in self.dir.glob("*.copy"):
            meta = read_meta(path)
            if meta is not None and path.stem.isdigit():
                steps[int(path.stem)], sizes[int(path.stem)] = meta["step"], meta["size"]
        return (own["step"] if own else None), steps, sizes

    def restore(self, state: dict, durable: int | None, unpickle_mode: str) -> int | None:
        """Collective: the step restored into ``state`` from the copies in node memory on
        every rank, or None (the caller reads the durable checkpoint)."""
        import torch.distributed as dist

        own, steps, sizes = self.held()
        every = self.comm.all_gather((own, steps, sizes))
        plan = restore_plan([(o, s) for o, s, _ in every], durable)
        if plan is None:
            return None
        step, sources = plan
        rank = self.comm.rank
        ops, blob = [], None
        for ward, source in sources.items():
            if source == rank and ward != rank:
                data = np.fromfile(self.dir / f"{ward}.copy", dtype=np.uint8)
                ops.append(dist.P2POp(dist.isend, torch.from_numpy(data),
                                      self.comm._global(ward), group=self.comm.group))
        if sources[rank] == rank:
            blob = np.fromfile(self.own, dtype=np.uint8)
        else:
            got = torch.empty(every[sources[rank]][2][rank], dtype=torch.uint8)
            ops.append(dist.P2POp(dist.irecv, got, self.comm._global(sources[rank]),
                                  group=self.comm.group))
        for request in dist.batch_isend_irecv(ops) if ops else ():
            request.wait()
        if blob is None:
            blob = got.numpy()
        why = restore_copy(blob, state, unpickle_mode)
        if why:
            print(f"hpctrain: rank {rank}: not restoring step {step} from a peer copy: "
                  f"{why}", file=sys.stderr, flush=True)
        if not all(not w for w in self.comm.all_gather(why)):
            return None
        return step

    def forget_others(self, step: int | None) -> None:
        """Drop the copies of any step but ``step`` (after a load: a copy of another step is
        of another past; the training goes on from ``step``)."""
        for path in [self.own, *self.dir.glob("*.copy")]:
            meta = read_meta(path)
            if meta is None or meta["step"] != step:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop sending (the last copy sent first, for up to CLOSE_WAIT_S) and receiving;
        the copies stay in node memory for a restart."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is None and not self._writing
                                and not self._sending, timeout=CLOSE_WAIT_S)
            self._closed = True
            self._cond.notify_all()
        self.server.close()
