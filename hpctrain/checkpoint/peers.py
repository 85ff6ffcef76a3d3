"""Peer copies of snapshots in host memory: a lost node costs at most two snapshot intervals.

A snapshot (:meth:`CheckpointManager.snapshot`) lives in its rank's process: a restart in
the same process restores it, but a lost node's step restarts in new processes everywhere
(on the survivors and a spare), and the snapshot is gone with them. With peer copies on
(``$HPCTRAIN_PEER_COPIES=1``: ``[elastic] peer_copies``, on by default with spare nodes)
the snapshot's staging memory is itself mapped from the node's memory
(:mod:`hpctrain.protocol.nodemem`: a job-private directory of ``/dev/shm``, which outlives
the processes), so the rank's own copy costs nothing more; and each snapshot is sent over
the network to the rank's *partner*, a rank on another node (:func:`~hpctrain.checkpoint.
peerplan.partners`: one node's loss never takes both copies), which keeps it in its own
node's memory and acknowledges it once it is whole there.

What a load can count on: a rank keeps two own copies, its newest snapshot and the newest
one its partner acknowledged (the next snapshot overwrites the other buffer, never that
one), and the partner keeps the two newest it received whole. So when every send finishes
within a snapshot interval, the step before the newest is whole on both sides for every
rank, and a node lost even mid-send costs at most two intervals. A send still on its way
when the next snapshot comes is cut short (the training never waits for the network) and
the job log says so when that keeps happening: copies that fall behind may leave no step
common to every rank.

On a load (:mod:`hpctrain.checkpoint.peerload`, collective) one rank of each node lists the
whole copies in its node's memory, whoever's they are (torchrun may seat other ranks on a
restarted node); rank 0 picks the newest step, no older than the newest durable
checkpoint, of which every rank has one (:func:`~hpctrain.checkpoint.peerplan.
restore_plan`), and the job log gets one line: the step and where each node's ranks take
their state from, or why none is restored. Every rank verifies and decodes its copy whole
before one collective agrees, and only then does any rank write into its state: all or
nothing, every refusal named.

Node memory: the copies' pages are reserved when mapped (``posix_fallocate``): a
``/dev/shm`` too small for them turns this rank's copies off with one line saying what was
needed and what was free, never a SIGBUS. Per rank about four times its snapshot (two own
buffers, two slots of its ward's). The directory is refused, and the copies turned off,
unless it is provably the user's own (as the progress relay's). An async save's staged
copy is not sent: it is not in node memory, and its step is durable moments later.
"""

from __future__ import annotations

import hmac
import mmap
import os
import pickle
import secrets
import socket
import stat
import threading
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain import access
from hpctrain.checkpoint import peerfile, peerload, remap
from hpctrain.checkpoint.fit import Fit
from hpctrain.checkpoint.peerload import say
from hpctrain.checkpoint.peerplan import ONE_NODE, Pairing, assign
from hpctrain.checkpoint.peerwire import (ACK, NO_ROOM, READY, NoRoom, Slots, header,
                                          open_own, read_header, recv_exact, release,
                                          reserve, shutdown)
from hpctrain.checkpoint.tree import Chunk
from hpctrain.protocol import FULL_DP, RESTART_COUNT, RUN_ID, channel, nodemem

CONNECT_S = 10.0                      # a partner that does not accept within this: no copy
CLOSE_WAIT_S = 10.0                   # a closing manager waits this long for the last send
CUT_WARN = 20                         # sends cut short in a row before the job log says so
WHERE_MAX = 1024                      # bytes of a rank's (node, port, why not), pickled
NICE = 19                             # the sending and receiving threads' (see _background)
BUFFERS = 2                           # own copies: the newest, and the partner's newest
MB = 1 << 20


def _background() -> None:
    """This thread yields the CPU to the training's (its checksums and copies run in the
    training's idle moments, as on a GPU node's idle cores): the most a thread can lower
    its own priority without privileges."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except OSError:
        pass


def guard(directory: Path) -> str:
    """Make this node's copies' directory (and its parent), or check them: "" when both are
    provably this user's (owned by it, writable by nobody else), else why not. A neighbour
    who planted either could read the copies or offer forged ones."""
    for path in (directory.parent, directory):
        why = access.own_dir(path, 0o700, parents=path == directory.parent)
        if not why:
            st = os.stat(path)        # (a link own_dir let pass is the user's own)
            if st.st_mode & 0o022:
                why = f"others may write in it (mode {stat.S_IMODE(st.st_mode):o})"
        if why:
            return f"{path}: {why}"
    return ""


# ---- one rank's copies ----------------------------------------------------------------------
class PeerCopies:
    """This rank's peer copies: its own snapshots in node memory (:meth:`allocate` maps a
    snapshot's staging there, two buffers) and at its partner, and the copies it keeps for
    its wards. Made by :meth:`start`; the manager calls :meth:`before_stage` and
    :meth:`put` around each snapshot, :meth:`restore` on a load and :meth:`loaded` after."""

    def __init__(self, comm: Any, directory: Path, node: str, pairing: Pairing, secret: str,
                 server: socket.socket) -> None:
        # the manager's group: given back at close (a group still referenced outlives its
        # attempt, and its connections keep a peer waiting: hpctrain.runtime.groups)
        self.comm, self.dir, self.node, self.rank = comm, directory, node, comm.rank
        self.partner, self.wards = tuple(pairing.partner), set(pairing.wards)
        self.lister, self.keep = pairing.lister, set(pairing.keep)
        self.secret, self.server = secret, server
        self.off = ""                           # why this rank keeps no copies now
        self.alone = False                      # no partner: own copies kept, none sent
        self._cond = threading.Condition()
        self._pages: list[mmap.mmap | None] = [None] * BUFFERS
        self._payload: list[tuple[int, Sequence[Chunk], bytes] | None] = [None] * BUFFERS
        self._latest: int | None = None         # the buffer put last
        self._acked: int | None = None          # the buffer whose step the partner holds
        self._pending: int | None = None        # the buffer to send next
        self._working: int | None = None        # the buffer the sending thread reads
        self._cancel = self._sending = self._closed = False
        self._broken = False                    # the connection was shut: close it
        self._cut = 0                           # sends cut short by a newer snapshot in a row
        self.puts = self.sent = 0               # snapshots put, and acknowledged whole
        self._sock: socket.socket | None = None
        self.failures: list[str] = []           # each kind of failure, said once
        self._ward_lock = {w: threading.Lock() for w in self.wards}
        self._adopt()
        threading.Thread(target=self._serve, name="hpctrain-peer-in", daemon=True).start()
        threading.Thread(target=self._send_loop, name="hpctrain-peer-out",
                         daemon=True).start()

    @classmethod
    def start(cls, comm: Any, env: Mapping[str, str] = os.environ) -> PeerCopies | None:
        """This rank's peer copies when ``$HPCTRAIN_PEER_COPIES`` asks for them and the job
        spans nodes (collective: every rank says where it listens), else None."""
        if env.get(nodemem.PEER_COPIES) != "1" or not comm.active:
            return None
        node = env.get("SLURMD_NODENAME") or socket.gethostname()
        run_id, restart = env.get(RUN_ID, "run"), int(env.get(RESTART_COUNT, "0") or 0)
        directory = nodemem.peer_dir(env, run_id, restart, node)
        unsafe = guard(directory)[:300]
        server = socket.create_server(("", 0)) if not unsafe else None
        port = server.getsockname()[1] if server is not None else 0
        # rank 0 pairs them: a gather of (node, port, why not), each rank its own part back
        # (its partner's address, its wards, ...), O(1) bytes a rank whatever the world
        gathered = comm.gather_bytes(pickle.dumps((node, port, unsafe)), size=WHERE_MAX)
        parts = None
        if gathered is not None:
            every = [pickle.loads(g) for g in gathered]
            planted = next((f"{n}: {u}" for n, _, u in every if u), "")
            pairing = assign([(n, p) for n, p, _ in every], bool(env.get(channel.TOKEN)),
                             planted)
            secret = secrets.token_hex(16)      # the copies' own: the job's ranks alone
            parts = [pickle.dumps((p, secret)) for p in pairing]
        mine, secret = pickle.loads(comm.scatter_bytes(parts))
        # a step shrunk onto one node: no partner for new copies, but the copies this node
        # kept before the shrink are the state to restore (the lost node's ranks' too)
        restore_only = mine.why == ONE_NODE and server is not None and bool(env.get(FULL_DP))
        if mine.why and not restore_only:
            if server is not None:
                server.close()
            if comm.rank == 0:
                say(f"peer copies of snapshots off: {mine.why}")
            return None
        assert server is not None
        if mine.lister:      # what a killed earlier run of this job left on this node
            nodemem.remove_earlier(env, run_id, restart, node)
        copies = cls(comm, directory, node, mine._replace(why=""), secret, server)
        if restore_only:
            copies.alone = True
            if comm.rank == 0:
                say("peer copies of snapshots: the step shrank onto one node, no partner for "
                    "new copies: the copies this node kept before are restored, and each "
                    "rank's new snapshots stay in this node's memory only (a crash restores "
                    "from there; a lost node would take them)")
        return copies

    # ---- a snapshot: kept in node memory, sent to the partner -----------------------------
    def allocate(self, index: int, nbytes: int) -> torch.Tensor:
        """Own buffer ``index``'s staging memory (``nbytes``), mapped from this node's
        memory, its pages reserved (:class:`NoRoom` when they do not fit)."""
        fd = open_own(self._data(index))
        try:
            # never shorter: a mapping made for the last layout may still be read (a kept
            # snapshot), and pages past the file's end would fault
            size = max(nbytes, os.fstat(fd).st_size, 1)
            os.ftruncate(fd, size)
            try:
                reserve(fd, size)
            except NoRoom as exc:
                free = os.fstatvfs(fd)
                raise NoRoom(
                    f"node memory {self.dir.parent} cannot hold this rank's copies: "
                    f"{size / MB:.1f} MB a buffer, {BUFFERS} buffers and as much again for "
                    f"each ward's two slots; {free.f_bavail * free.f_frsize / MB:.1f} MB "
                    f"free ({exc})") from None
            pages = mmap.mmap(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        old, self._pages[index] = self._pages[index], pages
        if old is not None:
            release(old)
        return torch.frombuffer(pages, dtype=torch.uint8)[:nbytes]

    def turn_off(self, why: str) -> None:
        """This rank keeps no more copies (its snapshots stay in its process): said once."""
        if not self.off:
            self.off = why
            say(f"rank {self.rank} ({self.node}): peer copies off: {why}; snapshots stay "
                "in this process's memory and the durable checkpoint still stands")

    def before_stage(self) -> int:
        """Which own buffer the next snapshot goes to, made ready: never the one whose step
        the partner holds (while a newer one is not held there); a send still reading it
        is cut short (the newer snapshot replaces it: the training never waits for the
        network), and its copy spoiled until the new one is whole."""
        with self._cond:
            target = self._target()
            if self._pending == target:
                self._pending = None
            if self._working == target:
                self._cancel = True
                if self._sending and self._sock is not None:
                    shutdown(self._sock)      # (the sending thread closes it)
                    self._broken = True
                    self._cut += 1
                    if self._cut == 1:
                        self._fail("a snapshot came before the last one had reached the "
                                   "partner: its send was cut short (a node lost now may "
                                   "cost more than two snapshot intervals)")
                    if self._cut == CUT_WARN:
                        self._fail(f"{CUT_WARN} snapshots in a row came before the last one "
                                   f"had reached the partner (peer copies fall behind: a lost "
                                   f"node may cost more than two snapshot intervals; snapshot "
                                   f"less often)")
                self._cond.wait_for(lambda: self._working != target)
                self._cancel = False
            if self._acked == target:          # (acknowledged as it was cut: too late)
                self._acked = None
            self._payload[target] = None
            if self._latest == target:
                self._latest = None
        self._meta(target).unlink(missing_ok=True)
        return target

    def _target(self) -> int:
        if self._latest is None:
            return 1 if self._acked == 0 else 0
        if self._acked is None or self._latest == self._acked:
            return 1 - self._latest  # (nothing acknowledged yet: keep the newest whole one)
        return self._latest          # not held by the partner: the acknowledged one stays

    def put(self, index: int, step: int, chunks: Sequence[Chunk], extras: bytes) -> None:
        """``chunks`` (staged in buffer ``index``) and the pickled ``extras`` are the
        snapshot of ``step``: its checksums and its send follow on the background thread."""
        with self._cond:
            self._payload[index] = (step, chunks, extras)
            self._latest = self._pending = index
            self.puts += 1
            self._cond.notify_all()

    def _send_loop(self) -> None:
        _background()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:      # closed, nothing left to send
                    break
                index, self._pending = self._pending, None
                payload = self._payload[index]
                self._working = index
            try:
                if payload is not None:
                    self._keep_and_send(index, *payload)
            except Exception as exc:  # noqa: BLE001 - the thread must live on: flush() waits
                self._fail(f"the copying thread failed ({exc!r})")
            finally:
                with self._cond:
                    self._working = None
                    self._cond.notify_all()
        if self._sock is not None:
            self._sock.close()

    def _keep_and_send(self, index: int, step: int, chunks: Sequence[Chunk],
                       extras: bytes) -> None:
        pages = self._pages[index]
        if pages is None:
            return
        end = peerfile.tail(self.rank, step, chunks, np.frombuffer(pages, np.uint8), extras,
                            stop=lambda: self._cancel)
        if end is None:                   # a newer snapshot is being staged over it
            return
        size = peerfile.meta_of(end)["data_size"]    # type: ignore[index]
        try:
            tmp = self._meta(index).with_name(f"{self._meta(index).name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(end)
            with self._cond:
                if self._cancel:          # a newer snapshot is being staged over it
                    return
                os.replace(tmp, self._meta(index))
        except OSError as exc:
            return self._fail(f"could not keep step {step} in node memory ({exc})")
        if self.alone:                    # kept in this node's memory; no partner to send to
            return
        try:
            with self._cond:
                if self._cancel:
                    return
                self._sending = True
            if self._sock is None:
                self._sock = socket.create_connection(self.partner, timeout=CONNECT_S)
                self._sock.settimeout(None)
            self._sock.sendall(header(self.secret, self.rank, step, size + len(end)))
            answer = recv_exact(self._sock, 1)
            if answer == NO_ROOM:
                self._fail(f"the partner on {self.partner[0]} has no room in its node "
                           f"memory for this rank's copy ({(size + len(end)) / MB:.1f} MB)")
                raise ConnectionAbortedError("no room at the partner")
            if answer != READY:
                raise ConnectionError(f"the partner answered {answer!r}")
            self._sock.sendall(memoryview(pages)[:size])
            self._sock.sendall(end)
            held = ACK.unpack(recv_exact(self._sock, ACK.size))[0]
            if held != step:
                raise ConnectionError(f"the partner acknowledged step {held}, not {step}")
            with self._cond:
                if not self._cancel:           # (else its buffer is being staged over)
                    self._acked = index
                    self._cut = 0
                    self.sent += 1
        except OSError as exc:
            if not self._cancel and not isinstance(exc, ConnectionAbortedError):
                self._fail(f"could not send step {step}'s copy to {self.partner[0]}:"
                           f"{self.partner[1]} ({exc})")
            self._broken = True
        finally:
            with self._cond:
                self._sending = False
                if self._broken and self._sock is not None:
                    self._sock.close()         # cut, or failed: the next send connects anew
                    self._sock = None
                self._broken = False

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
        (the newer one stays whole while the next arrives), straight into its pages. One
        copy of a ward at a time: a sender that cut a send short connects anew while the
        old connection's thread may still be on its way out."""
        _background()
        with conn, closing(Slots()) as slots:
            while True:
                head = read_header(conn)
                if head is None or not hmac.compare_digest(
                        str(head.get("secret", "")), self.secret) or \
                        head["rank"] not in self.wards:
                    break            # closed, or not a ward of this job's
                try:
                    with self._ward_lock[head["rank"]]:
                        older = min(self._slots(head["rank"]),
                                    key=lambda sm: sm[1]["step"] if sm[1] else -1)[0]
                        if not slots.receive(conn, older, head["nbytes"], head["step"]):
                            break
                except NoRoom as exc:
                    self._fail(f"no room in node memory for rank {head['rank']}'s copy "
                               f"({head['nbytes'] / MB:.1f} MB: {exc})")
                    break
                except OSError:
                    break
                except Exception as exc:  # noqa: BLE001 - said; the sender's copy is not acked
                    self._fail(f"the receiving thread failed ({exc!r})")
                    break

    # ---- node memory's files ----------------------------------------------------------------
    def _data(self, index: int) -> Path:
        return self.dir / f"{self.rank}.{index}.data"

    def _meta(self, index: int) -> Path:
        return self.dir / f"{self.rank}.{index}.meta"

    def _slots(self, ward: int) -> list[tuple[Path, dict | None]]:
        return [(s, peerfile.read_meta(s)) for s in (self.dir / f"{ward}.{n}.copy"
                                                      for n in "ab")]

    def _adopt(self) -> None:
        """Own copies already in node memory (a restart on this node, after a load): the
        newest is kept (the next snapshot goes to the other buffer); none is known to be
        held by this pairing's partner."""
        steps = [(meta["step"], i) for i in range(BUFFERS)
                 if (meta := peerfile.read_meta(self._meta(i))) is not None]
        with self._cond:
            self._latest, self._acked = (max(steps)[1] if steps else None), None

    def _fail(self, what: str) -> None:
        kind = what.split(" (")[0]
        if kind not in self.failures:
            self.failures.append(kind)
            say(f"rank {self.rank} ({self.node}): peer copy: {what}; the durable "
                "checkpoint still stands")

    # ---- a load (hpctrain.checkpoint.peerload) ----------------------------------------------
    def restore(self, state: dict, durable: int | None, unpickle_mode: str,
                fit: Fit | None = None) -> tuple[int | None, str]:
        """Collective: :func:`hpctrain.checkpoint.peerload.restore`."""
        return peerload.restore(self, state, durable, unpickle_mode, fit)

    def loaded(self, step: int | None) -> None:
        """Collective, after a load of ``step`` (or none): :func:`~hpctrain.checkpoint.
        peerload.forget`, then this rank's own copies of ``step`` adopted."""
        # a step shrunk to fewer replicas took other ranks' copies (a pipeline stage's
        # rank numbers move): no copy of the step kept under its old rank may be adopted
        sources = remap.shrunk_sources(self.comm.world)
        moved = sources is not None and any(s != r for r, s in enumerate(sources))
        peerload.forget(self.dir, self.rank, self.wards, self.keep, self.lister,
                        None if moved else step)
        self.comm.barrier()          # no rank stages a snapshot while a lister removes
        self._adopt()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout`` seconds) until the last snapshot put has been sent or
        given up; whether it has."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._pending is None and self._working is None, timeout=timeout)

    def close(self) -> None:
        """Stop sending (the last copy sent first, for up to CLOSE_WAIT_S) and receiving;
        the copies stay in node memory for a restart."""
        self.flush(CLOSE_WAIT_S)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.server.close()
        self.comm = None       # the receiving threads outlive this: they must not hold it
