"""One rank of tests/unit/test_ckpt_peer_matrix.py's crash-point matrix of peer copies.

Four ranks on two "nodes" ($SLURMD_NODENAME; node memory under a temporary directory),
forked from a server that imported torch (helpers.ckpt). ``train``: snapshots of steps
1..STEPS (a durable save at DURABLE unless the cell has none), every rank's state a function
of (step, rank) so that any restore can be checked bitwise; before the last snapshot each
rank waits until its previous copy is acknowledged, then arms the cell's hook, which
SIGKILLs this process at one point of the copy protocol (the *victims*: the ranks of the
node being lost). ``resume``: new processes load the newest step (``load_latest``), an
optional hook killing one of them at one point of the restore; each rank says the step and
whether its whole state is exactly that step's (or, with none, exactly as built: nothing
written by halves).

Hooks patch the product's functions in this process only (test code): the protocol runs
as shipped until the kill.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

STEPS, DURABLE, ROWS = 6, 2, 128          # 128 x 1024 float32: 0.5 MB a tensor


class Custom:
    """An extra of the user's own class: the safe unpickler refuses it."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Custom)


def value(step: int, rank: int) -> float:
    return float(step * 100 + rank)


def state_at(step: int, rank: int, rows: int = ROWS, extra: Any = None) -> dict:
    """Rank ``rank``'s state after ``step`` (0: as built, the same on every rank)."""
    import torch

    v = value(step, rank) if step else 0.0
    return {"model": {"w": torch.full((rows, 1024), v),
                      "b": torch.full((rows,), v, dtype=torch.bfloat16)},
            "optim": {"m": torch.full((rows, 1024), v / 2)},
            "step": step, "extra": {"rank": rank if step else 0, "step": step,
                                    "more": extra}}


def same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return bool(a == b)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# ---- the kill points ---------------------------------------------------------------------------
def arm_copy(stage: str, armed: threading.Event, last: int) -> None:
    """Patch this process so that it dies at ``stage`` of the copy of step ``last``."""
    from hpctrain.checkpoint import peerfile, peers, peerwire

    def when(fn: Any, before: bool = True, test: Any = lambda *a: True) -> Any:
        def wrapped(*args: Any, **kw: Any) -> Any:
            if before and armed.is_set() and test(*args):
                die()
            out = fn(*args, **kw)
            if not before and armed.is_set() and test(*args):
                die()
            return out
        return wrapped

    if stage == "acknowledged":           # (the rank dies once its last send is acknowledged)
        return
    if stage == "staged":                 # staged in node memory, no checksum, no meta
        peers.PeerCopies.put = when(peers.PeerCopies.put)
    elif stage == "checksummed":          # tail computed, not yet kept
        peerfile.tail = when(peerfile.tail, before=False)
    elif stage == "kept":                 # own copy whole in node memory, send not begun
        peers.header = when(peers.header)
    elif stage == "header-sent":          # the partner told what comes, no byte of it yet
        peers.recv_exact = when(peers.recv_exact, test=lambda sock, n: n == 1)
    elif stage == "unacknowledged":       # every byte sent, the partner's ack not read
        peers.recv_exact = when(peers.recv_exact,
                                 test=lambda sock, n: n == peerwire.ACK.size)
    elif stage == "mid-send":             # half the copy's bytes sent
        plain = socket.socket.sendall

        def half(self: socket.socket, data: Any, *a: Any) -> Any:
            view = memoryview(data)
            if armed.is_set() and view.nbytes > 65536:
                plain(self, view[:view.nbytes // 2])
                time.sleep(0.2)
                die()
            return plain(self, data, *a)
        socket.socket.sendall = half      # type: ignore[method-assign]
    elif stage == "slow-send":            # the copy of `last` held back: the next cuts it
        plain = socket.socket.sendall

        def slow(self: socket.socket, data: Any, *a: Any) -> Any:
            if armed.is_set() and memoryview(data).nbytes > 65536:
                armed.clear()
                time.sleep(3)
            return plain(self, data, *a)
        socket.socket.sendall = slow      # type: ignore[method-assign]
    elif stage == "receiving":            # the partner's side: half the copy in its slot
        receive = peerwire.Slots.receive

        def recv(self: Any, conn: socket.socket, path: Path, size: int, step: int) -> bool:
            if not (armed.is_set() and step == last):
                return receive(self, conn, path, size, step)
            pages = self._pages(path, size)
            conn.sendall(peerwire.READY)
            got = 0
            while got < size // 2:
                got += conn.recv_into(memoryview(pages)[got:size // 2])
            die()
            return False
        peerwire.Slots.receive = recv     # type: ignore[method-assign]
    elif stage == "received":             # the partner's side: whole, not acknowledged
        ack = peerwire.ACK

        class Dying:
            size = ack.size

            @staticmethod
            def pack(step: int) -> bytes:
                if armed.is_set() and step == last:
                    die()
                return ack.pack(step)
        peerwire.ACK = Dying              # type: ignore[assignment]
    else:
        raise ValueError(stage)


def arm_restore(stage: str) -> None:
    """Patch this process so that it dies at ``stage`` of a load."""
    from hpctrain.checkpoint import comm, peerfile, peerload

    if stage == "planning":
        plan = peerload.restore_plan
        peerload.restore_plan = lambda *a: die() or plan(*a)
    elif stage == "sending":
        exchange = comm.Comm.exchange
        comm.Comm.exchange = lambda self, sends, rec: (die() if sends else None) or \
            exchange(self, sends, rec)
    elif stage == "decoding":
        decode = peerfile.decode
        peerfile.decode = lambda *a: die() or decode(*a)
    elif stage == "applying":             # the first tensor half written, then the end
        def half(decoded: Any, state: dict) -> None:
            first = decoded.into[0][0].local
            first[: len(first) // 2].fill_(7.0)
            die()
        peerfile.apply = half
    elif stage == "forgetting":
        step_of, calls = peerload.step_of, []

        def once(path: Path) -> Any:
            calls.append(path)
            if len(calls) > 1:
                die()
            return step_of(path)
        peerload.step_of = once
    else:
        raise ValueError(stage)


# ---- the two phases ------------------------------------------------------------------------------
def main(rank: int, tmp: str, phase: str, nodes: list[str], port: int, cell: dict) -> None:
    """One rank (forked): its environment as srun and the supervisor would set it."""
    tmp_path = Path(tmp)
    log = os.open(tmp_path / f"{phase}-{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 2)
    os.environ.update({
        "HPCTRAIN_PEER_COPIES": "1", "HPCTRAIN_PROGRESS_TOKEN": "token",
        "HPCTRAIN_RUN_ID": "r1", "HPCTRAIN_RESTART_COUNT": "0",
        "HPCTRAIN_LOCAL_DIR": str(tmp_path / "shm"), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "WORLD_SIZE": str(len(nodes)), "RANK": str(rank),
        "SLURMD_NODENAME": nodes[rank], "OMP_NUM_THREADS": "1"})
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        {"train": train, "again": again, "resume": resume, "plain": plain}[phase](
            rank, tmp_path, nodes, cell)
    except BaseException as exc:   # noqa: BLE001 - said in the rank's log for the test
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(5)


def train(rank: int, tmp: Path, nodes: list[str], cell: dict) -> None:
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager

    mgr = CheckpointManager(tmp / "ckpt", keep_last=2)
    peers = mgr._memory.peers
    assert peers is not None, "peer copies are off"
    victim = nodes[rank] == cell["lost"]
    armed = threading.Event()
    if victim and cell.get("copy"):
        arm_copy(cell["copy"], armed, STEPS)
    extra = cell.get("extra") if rank == cell.get("extra_rank") else None
    for step in range(1, STEPS + (2 if cell.get("copy") == "slow-send" else 1)):
        state = state_at(step, rank, extra=extra)
        if step == DURABLE and cell.get("durable", True):
            mgr.save(step, state)
        if step == STEPS:
            assert peers.flush(60), f"rank {rank}: step {step - 1}'s copy never went"
            if victim:      # armed before the barrier: a partner's copy of the last step
                armed.set()  # may arrive before this thread leaves it (the hooks ask the step)
            dist.barrier()          # every copy before the last one is acknowledged
        if step == STEPS + 1 and victim and cell.get("then"):
            then = threading.Event()
            arm_copy(cell["then"], then, step)
            then.set()
        mgr.snapshot(step, state)
    lost(rank, tmp, peers, victim, cell)


def lost(rank: int, tmp: Path, peers: Any, victim: bool, cell: dict) -> None:
    """The end of a phase that loses a node: a victim dies at its armed point (or once its
    last copy is acknowledged); a survivor keeps its node's memory and goes when the node
    is lost (the test says so with a file), without a collective the dead could not join."""
    if victim:
        if cell["copy"] in ("acknowledged", "slow-send") and not cell.get("then"):
            sent = peers.sent
            peers.flush(60)
            assert peers.sent > sent, f"rank {rank}: its last copy was not acknowledged"
            die()
        time.sleep(60)
        os._exit(3)                 # the kill point was never reached: the test fails
    end = time.monotonic() + 120
    while not (tmp / "lost").exists() and time.monotonic() < end:
        time.sleep(0.02)
    peers.flush(5)
    os._exit(0)


def again(rank: int, tmp: Path, nodes: list[str], cell: dict) -> None:
    """After a loss: load (as ``resume``), one more snapshot, and a second node lost at the
    cell's point of that snapshot's copy (``early``: before the load's own copies went)."""
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager

    mgr = CheckpointManager(tmp / "ckpt", keep_last=2)
    state = state_at(0, rank)
    step = mgr.load_latest(state)
    peers = mgr._memory.peers
    assert step is not None and peers is not None, (step, peers)
    victim = nodes[rank] == cell["lost"]
    if cell.get("early"):
        if victim:
            die()
        lost(rank, tmp, peers, victim, cell)
    assert peers.flush(60)
    dist.barrier()
    armed = threading.Event()
    if victim:
        arm_copy(cell["copy"], armed, step + 1)
        armed.set()
    mgr.snapshot(step + 1, state_at(step + 1, rank))
    lost(rank, tmp, peers, victim, cell)


def plain(rank: int, tmp: Path, nodes: list[str], cell: dict) -> None:
    """Snapshots of steps 1..4 (a durable save at DURABLE) with whatever node memory gives,
    to the end, every rank: whether its copies were on, and why off."""
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager

    mgr = CheckpointManager(tmp / "ckpt", keep_last=2)
    peers = mgr._memory.peers
    for step in range(1, 5):
        state = state_at(step, rank)
        if step == DURABLE:
            mgr.save(step, state)
        mgr.snapshot(step, state)
    if peers is not None:
        peers.flush(30)
    (tmp / f"out-{rank}.json").write_text(json.dumps({
        "peers": peers is not None, "off": peers.off if peers is not None else ""}))
    mgr.close()
    dist.barrier()
    dist.destroy_process_group()


def resume(rank: int, tmp: Path, nodes: list[str], cell: dict) -> None:
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager

    if cell.get("restore") and rank == cell.get("restore_rank", 0):
        arm_restore(cell["restore"])
    state = state_at(0, rank, rows=cell.get("rows", ROWS))
    mgr = CheckpointManager(tmp / "ckpt", keep_last=2, unpickle=cell.get("unpickle", "safe"))
    step = mgr.load_latest(state)
    mgr.close()
    want = state_at(0, rank, rows=cell.get("rows", ROWS)) if step is None else \
        state_at(step, rank, extra=cell.get("extra") if rank == cell.get("extra_rank") else None)
    (tmp / f"out-{rank}.json").write_text(json.dumps({"step": step,
                                                      "exact": same(state, want)}))
    dist.barrier()
    dist.destroy_process_group()
