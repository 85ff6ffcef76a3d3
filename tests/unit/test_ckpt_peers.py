"""Peer copies of snapshots (hpctrain.checkpoint.peers): who keeps whose copy, which step is
restored from where, one copy's file (checksums, layout), and four ranks on two "nodes" in
real processes (gloo) through a node's loss, a damaged copy and both copies lost."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.checkpoint.peerplan import Held, assign, partners, restore_plan

PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "peer_copy_worker.py"


# ---- who keeps whose copy --------------------------------------------------------------------
@pytest.mark.parametrize("hosts", [
    ["n1", "n1", "n2", "n2"],
    ["n1", "n1", "n2", "n2", "n3", "n3"],
    ["a", "a", "a", "b"],                       # nodes of unequal size
    ["n1", "n2", "n1", "n2"],                   # cyclic placement
    [f"n{i // 8}" for i in range(64)],
])
def test_a_partner_is_never_on_the_rank_s_own_node(hosts: list[str]) -> None:
    plan = partners(hosts)
    assert all(p is not None and hosts[p] != hosts[r] for r, p in enumerate(plan)), plan
    # with nodes of equal size every rank keeps exactly one copy: memory spread evenly
    if len({hosts.count(h) for h in hosts}) == 1:
        assert sorted(plan) == list(range(len(hosts)))


def test_one_node_has_no_partner() -> None:
    assert partners(["n1", "n1"]) == [None, None]


# ---- which step, from where -------------------------------------------------------------------
def held(**nodes: list[tuple[int, int]]) -> dict[str, list[Held]]:
    """node -> its whole copies, each (whose rank, step); own buffers and slots alike."""
    return {n: [Held(r, s, 100 + r, f"{r}.{s % 2}") for r, s in copies]
            for n, copies in nodes.items()}


def test_the_newest_step_every_rank_has_a_copy_of_is_restored() -> None:
    # ranks 2, 3 were on a lost node, now a spare's: n1 holds its own ranks' and theirs
    plan = restore_plan(["n1", "n1", "n3", "n3"],
                        held(n1=[(0, 7), (1, 7), (2, 7), (3, 7), (0, 6), (2, 6)], n3=[]), 4)
    assert [r.step for r in plan.routes] == [7] * 4
    assert [r.local for r in plan.routes[:2]] == ["0.1", "1.1"]
    assert plan.routes[2].receive == (0, 102) and plan.routes[3].receive == (1, 103)
    assert plan.routes[0].sends == [(2, "2.1", 102)] and plan.routes[1].sends == [(3, "3.1", 103)]
    assert plan.line == ("restoring step 7 from node memory (durable: 4): on n1 ranks 0-1 "
                         "from the node's own memory; on n3 ranks 2-3 from copies kept on n1")


def test_a_copy_missing_for_one_rank_falls_back_to_an_older_common_step_or_none() -> None:
    nodes = ["n1", "n2"]
    plan = restore_plan(nodes, held(n1=[(0, 7), (0, 6), (1, 6)], n2=[(1, 7)]), None)
    assert plan.routes[0].step == 7 and plan.routes[1].local == "1.1"
    # never a mix: rank 0 has 8 and 7, rank 1 only 6 and 8's absent for it
    plan = restore_plan(nodes, held(n1=[(0, 8), (0, 7)], n2=[(1, 6)]), None)
    assert [r.step for r in plan.routes] == [None, None]
    assert plan.line == ("no step of which every rank has a whole copy (the newest, 8, is "
                         "missing for ranks 1: their steps held rank 1: 6)")
    assert restore_plan(nodes, {}, None).line == "no copies in node memory"


def test_copies_are_found_by_whose_they_are_not_by_who_sits_on_the_node() -> None:
    """torchrun's rendezvous seated ranks 0-1 on the spare n3 and 2-3 on n1, which holds
    ranks 0-1's own copies and ranks 2-3's kept by their partners."""
    plan = restore_plan(["n3", "n3", "n1", "n1"],
                        held(n1=[(0, 5), (1, 5), (2, 5), (3, 5)], n3=[]), None)
    assert [r.step for r in plan.routes] == [5] * 4
    assert plan.routes[2].local == "2.1" and plan.routes[3].local == "3.1"
    assert plan.routes[0].receive == (2, 100) and plan.routes[1].receive == (3, 101)
    assert "on n3 ranks 0-1 from copies kept on n1" in plan.line


def test_rank_0_answers_each_rank_with_its_part_only() -> None:
    """Set-up and restore go through rank 0 (a gather, each rank its own part back): what a
    rank receives does not grow with the rank count."""
    import pickle

    where = [("n1", 1001), ("n1", 1002), ("n2", 2001), ("n2", 2002)]
    parts = assign(where, True)
    assert parts[0] == (("n2", 2001), [2], True, [0, 1, 2, 3], "")
    assert parts[1].lister is False and parts[2] == (("n1", 1001), [0], True, [0, 1, 2, 3], "")
    assert assign([("n1", 1), ("n1", 2)], True)[0].why == "the job runs on one node"
    assert "no supervisor" in assign([("a", 0), ("b", 0)], False)[1].why
    assert assign(where, True, "n2: /dev/shm/x: planted")[3].why == "n2: /dev/shm/x: planted"
    big = [len(pickle.dumps(p)) for p in assign([(f"n{r // 8}", 1000 + r)
                                                  for r in range(4096)], True)]
    assert max(big) < 300, max(big)
    plan = restore_plan([f"n{r // 8}" for r in range(4096)],
                        held(**{f"n{n}": [(r, 3) for r in range(n * 8, n * 8 + 8)]
                                for n in range(512)}), None)
    assert max(len(pickle.dumps(r)) for r in plan.routes) < 200


def test_a_durable_checkpoint_newer_than_every_copy_wins() -> None:
    plan = restore_plan(["n1", "n2"], held(n1=[(0, 7), (1, 7)], n2=[(0, 7), (1, 7)]), 10)
    assert plan.routes[0].step is None
    assert plan.line == "the durable step 10 is newer than every copy (newest: 7)"
    plan = restore_plan(["n1", "n2"], held(n1=[(0, 10)], n2=[(1, 10)]), 10)
    assert plan.routes[0].step == 10


# ---- one copy's file ----------------------------------------------------------------------
@pytest.mark.torch
def test_a_copy_round_trips_and_a_damaged_or_foreign_one_is_refused(tmp_path: Path) -> None:
    """A snapshot staged in one block (as node memory holds it), its tail written: it
    restores bitwise; a flipped byte, another layout or a cut copy are refused by name."""
    import numpy as np
    import torch

    from hpctrain.checkpoint import peerfile
    from hpctrain.checkpoint.tree import flatten
    from hpctrain.checkpoint.writer import Staging

    state = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
             "b": torch.ones(5, dtype=torch.bfloat16), "step": 9, "cfg": {"lr": 0.1}}
    block = torch.zeros(4096, dtype=torch.uint8)
    staged = Staging(lambda n: block[:n]).stage(*flatten(state))
    data = block.numpy()
    end = np.frombuffer(peerfile.tail(0, 9, staged.chunks, data, staged.extras), np.uint8)
    meta = peerfile.meta_of(end)
    assert meta is not None and meta["step"] == 9 and meta["data_size"] == 64 + 10  # b at 64
    dest = {"w": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16), "step": 0,
            "cfg": {}}
    peerfile.apply(peerfile.decode(data, end, dest, "safe"), dest)
    assert torch.equal(dest["w"], state["w"]) and torch.equal(dest["b"], state["b"])
    assert dest["step"] == 9 and dest["cfg"] == {"lr": 0.1}
    damaged = data.copy()
    damaged[5] ^= 0xFF
    assert peerfile.decode(damaged, end, dest, "safe") == "checksum mismatch in ['w']"
    other = {"w": torch.zeros(4, 3), "b": torch.zeros(5, dtype=torch.bfloat16)}
    assert peerfile.decode(data, end, other, "safe") == \
        "the state is laid out otherwise (at ['w'])"
    assert torch.equal(other["w"], torch.zeros(4, 3))           # refused: nothing written
    # a value the copy holds and the state lacks is added (a fresh optimizer's moments),
    # as a load from storage adds it; one the state holds and the copy lacks is refused
    fresh: dict = {"w": torch.zeros(3, 4)}
    peerfile.apply(peerfile.decode(data, end, fresh, "safe"), fresh)
    assert torch.equal(fresh["b"], state["b"]) and fresh["cfg"] == {"lr": 0.1}
    more = {**dest, "extra": torch.zeros(2)}
    assert peerfile.decode(data, end, more, "safe") == \
        "the state is laid out otherwise (at ['extra'])"
    assert peerfile.decode(data, end[:-3], dest, "safe") == "not a whole copy"
    # extras of a class the safe unpickler refuses: refused before anything is written
    staged = Staging(lambda n: block[:n]).stage(*flatten({**state, "cfg": Path("/x")}))
    end2 = np.frombuffer(peerfile.tail(0, 9, staged.chunks, data, staged.extras), np.uint8)
    target = {"w": torch.zeros(3, 4)}
    assert peerfile.decode(data, end2, target, "safe").startswith("its extras were refused")
    assert torch.equal(target["w"], torch.zeros(3, 4)) and list(target) == ["w"]
    # a ward's copy is one file, data then tail; cut by one byte it is no copy at all
    (tmp_path / "2.a.copy").write_bytes(data[:74].tobytes() + end.tobytes())
    assert (peerfile.read_meta(tmp_path / "2.a.copy") or {}).get("step") == 9
    (tmp_path / "cut.copy").write_bytes((tmp_path / "2.a.copy").read_bytes()[:-1])
    assert peerfile.read_meta(tmp_path / "cut.copy") is None


@pytest.mark.torch
def test_a_parameter_that_requires_grad_is_restored_whole_from_a_copy_and_a_snapshot() -> None:
    """A state_dict(keep_vars=True) or a hand-made state holds leaves that require grad: a
    restore writes them outside autograd, all of them (not the first tensors, then an
    exception on every rank)."""
    import numpy as np
    import torch

    from hpctrain.checkpoint import peerfile
    from hpctrain.checkpoint.snapshot import Snapshot
    from hpctrain.checkpoint.tree import flatten
    from hpctrain.checkpoint.writer import Staging

    state = {"a_buf": torch.full((4,), 5.0), "w": torch.nn.Parameter(torch.full((3,), 5.0))}
    block = torch.zeros(4096, dtype=torch.uint8)
    staged = Staging(lambda n: block[:n]).stage(*flatten(state))
    end = np.frombuffer(peerfile.tail(0, 5, staged.chunks, block.numpy(), staged.extras),
                        np.uint8)
    dest = {"a_buf": torch.zeros(4), "w": torch.nn.Parameter(torch.zeros(3))}
    peerfile.apply(peerfile.decode(block.numpy(), end, dest, "safe"), dest)
    assert torch.equal(dest["w"].detach(), torch.full((3,), 5.0)) and dest["w"].requires_grad
    again = {"a_buf": torch.zeros(4), "w": torch.nn.Parameter(torch.zeros(3))}
    kept = Snapshot(5, staged)
    kept.apply(kept.decode(again), again)
    assert torch.equal(again["w"].detach(), torch.full((3,), 5.0))


# ---- the wire ----------------------------------------------------------------------------------
def test_a_slot_is_received_in_place_its_mapping_kept_until_the_file_or_size_changes(
        tmp_path: Path) -> None:
    """Copy after copy into one slot: each whole on arrival (the last one's trailer spoiled
    first), the mapping kept; a slot file removed meanwhile (a load's forget_others) or a
    copy of another size is mapped afresh, never written into a file nobody can see."""
    import socket
    import threading

    from hpctrain.checkpoint import peerfile
    from hpctrain.checkpoint.peerwire import ACK, READY, Slots, header, read_header

    slot, slots = tmp_path / "3.a.copy", Slots()
    copies = [bytes([n]) * 4096 + peerfile.TRAILER.pack(0, peerfile.MAGIC) for n in (1, 2)]
    copies += [b"\x03" * 8192 + peerfile.TRAILER.pack(0, peerfile.MAGIC)]
    ours, theirs = socket.socketpair()
    with ours, theirs:
        for n, copy in enumerate(copies):
            if n == 2:
                slot.unlink()
            sender = threading.Thread(target=theirs.sendall,
                                      args=(header("tok", 3, n, len(copy)) + copy,))
            sender.start()
            head = read_header(ours)
            assert head == {"secret": "tok", "rank": 3, "step": n, "nbytes": len(copy)}
            kept = dict(slots._maps)
            assert slots.receive(ours, slot, head["nbytes"], n)
            sender.join()
            assert theirs.recv(1) == READY and ACK.unpack(theirs.recv(ACK.size)) == (n,)
            assert slot.read_bytes() == copy
            if n == 1:      # the same file, the same size: the same pages
                assert slots._maps[slot] is kept[slot]
        # the file removed: a new one, mapped afresh
        assert slots._maps[slot][0] == slot.stat().st_ino
        theirs.sendall(header("tok", 3, 4, 100) + b"x" * 10)
        theirs.shutdown(socket.SHUT_WR)
        head = read_header(ours)
        assert head is not None and not slots.receive(ours, slot, head["nbytes"], 4)
        assert peerfile.read_meta(slot) is None      # cut short: spoiled, no copy
        assert read_header(ours) is None
    slots.close()


# ---- four ranks on two nodes, for real ---------------------------------------------------------
def run_ranks(tmp: Path, phase: str, nodes: list[str], extra: dict | None = None) -> list[dict]:
    """PROGRAM on 4 ranks (their own processes, as srun starts them), rank r on nodes[r]."""
    from helpers.ckpt import free_port

    port = str(free_port())
    base = {"HPCTRAIN_PEER_COPIES": "1", "HPCTRAIN_PROGRESS_TOKEN": "secret-token",
            "HPCTRAIN_RUN_ID": "r1", "HPCTRAIN_RESTART_COUNT": "0",
            "HPCTRAIN_LOCAL_DIR": str(tmp / "shm"), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port, "WORLD_SIZE": "4", "OMP_NUM_THREADS": "1",
            "PATH": "/usr/bin:/bin", **(extra or {})}
    procs = [subprocess.Popen([sys.executable, str(PROGRAM), phase, str(tmp / "ckpt"),
                               str(tmp / f"out-{phase}-{r}.json")],
                              env={**base, "RANK": str(r), "SLURMD_NODENAME": nodes[r]},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(4)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)[-4000:]
    return [json.loads((tmp / f"out-{phase}-{r}.json").read_text()) for r in range(4)]


def shm(tmp: Path, node: str) -> Path:
    (found,) = (tmp / "shm").glob(f"hpctrain-*/r1-0-{node}.peer")
    return found


@pytest.mark.torch
@pytest.mark.slow
def test_a_lost_node_s_ranks_restore_from_their_partners_copies(tmp_path: Path) -> None:
    """Ranks 0-1 on n1, 2-3 on n2 snapshot steps 1-7 (a durable save at 4); n2 is lost
    (its node memory gone) and ranks 2-3 start again on the spare n3: every rank restores
    step 7, ranks 2-3 from the copies n1 keeps, bitwise, each rank its own values. Then
    every copy of rank 2's is damaged in node memory: each is checked before use, and every
    rank loads the durable step 4 instead."""
    (tmp_path / "ckpt").mkdir()
    first = run_ranks(tmp_path, "train", ["n1", "n1", "n2", "n2"])
    names = sorted(p.name for p in shm(tmp_path, "n1").iterdir())
    # each rank's two own buffers (the newest, the newest its partner holds: the other's
    # tail may be gone, its send cut short by the next snapshot), its ward's slots
    assert {"0.0.data", "0.1.data", "1.0.data", "1.1.data"} <= set(names), names
    assert {"0.0.meta", "0.1.meta"} & set(names) and {"1.0.meta", "1.1.meta"} & set(names)
    assert {n.split(".")[0] for n in names if n.endswith(".copy")} == {"2", "3"}, names
    shutil.rmtree(shm(tmp_path, "n2"))                      # n2 is gone
    after = run_ranks(tmp_path, "resume", ["n1", "n1", "n3", "n3"])
    assert [a["step"] for a in after] == [7] * 4, after
    assert [a["w"] for a in after] == [f["w"] for f in first]          # bitwise (as hex)
    assert [a["rng"] for a in after] == [f["rng"] for f in first]      # each rank its own

    # the step-7 copies stay (the training goes on from step 7), and the load snapshotted
    # step 7 again at once (rank 2 now keeps its own on n3, its new partner one on n1):
    # every copy of rank 2's damaged, each is checked before use, and every rank loads the
    # durable step 4 instead
    damaged = [*shm(tmp_path, "n1").glob("2.*.copy"), *shm(tmp_path, "n3").glob("2.*.data")]
    assert {c.name for c in damaged} >= {"2.a.copy", "2.0.data"}, damaged
    for copy in damaged:
        with open(copy, "r+b") as fh:
            fh.seek(10)
            byte = fh.read(1)
            fh.seek(10)
            fh.write(bytes([byte[0] ^ 0xFF]))
    again = run_ranks(tmp_path, "resume", ["n1", "n1", "n3", "n3"])
    assert [a["step"] for a in again] == [4] * 4, again


def test_a_header_cut_by_a_reset_connection_is_no_header() -> None:
    """A sender whose process died resets its connection while the partner waits for the
    next header: no copy, and no traceback from the receiving thread in the job log."""
    import socket
    import struct

    from hpctrain.checkpoint.peerwire import read_header

    server = socket.create_server(("127.0.0.1", 0))
    theirs = socket.create_connection(server.getsockname())
    ours, _ = server.accept()
    with server, ours:
        # SO_LINGER 0: close sends a reset (RST), as a killed process's kernel may
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        theirs.close()
        assert read_header(ours) is None
