"""Peer copies' crash-point matrix (issue 55): a node lost, or a rank killed, at every point
of a copy and of a restore, in real processes (four ranks on two "nodes", gloo), as the
durable commit has its kill -9 trials.

Every cell: the ranks resume from the newest step of which every rank has a whole copy
(never a mix of steps: each rank's whole state is checked bitwise against that step's), or
from the durable checkpoint with the job log saying why; a refused restore writes nothing
into any rank's state; nothing hangs. The programs: tests/programs/peer_matrix_worker.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.ckpt import _forkserver, free_port
from programs.peer_matrix_worker import DURABLE, STEPS, main

pytestmark = [pytest.mark.torch]
N = STEPS
BEFORE, AFTER = ["n1", "n1", "n2", "n2"], ["n1", "n1", "n3", "n3"]
TORCHRUN = ["n3", "n3", "n1", "n1"]         # the spare's agent took node rank 0


def start(tmp: Path, phase: str, nodes: list[str], cell: dict) -> list:
    ctx, port = _forkserver(), free_port()
    procs = [ctx.Process(target=main, args=(r, str(tmp), phase, nodes, port, cell))
             for r in range(len(nodes))]
    for p in procs:
        p.start()
    return procs


def logs(tmp: Path, phase: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(tmp.glob(f"{phase}-*.log")))


def lose(tmp: Path, cell: dict, phase: str = "train", nodes: list[str] = BEFORE) -> None:
    """Train (or ``phase``); the cell's node dies at the cell's point (its ranks SIGKILLed
    there, then its memory gone), the other node's ranks go after."""
    (tmp / "ckpt").mkdir(exist_ok=True)
    (tmp / "lost").unlink(missing_ok=True)
    procs = start(tmp, phase, nodes, cell)
    victims = [r for r, n in enumerate(nodes) if n == cell["lost"]]
    try:
        for r in victims:
            procs[r].join(120)
            assert procs[r].exitcode == -9, (r, procs[r].exitcode, logs(tmp, phase)[-3000:])
        (tmp / "lost").touch()
        for r, p in enumerate(procs):
            p.join(120)
            assert r in victims or p.exitcode == 0, (r, p.exitcode, logs(tmp, phase)[-3000:])
    finally:
        for p in procs:
            p.kill()
    (found,) = (tmp / "shm").glob(f"hpctrain-*/r1-0-{cell['lost']}.peer")
    shutil.rmtree(found)


def resume(tmp: Path, nodes: list[str], cell: dict) -> tuple[int | None, str]:
    """New processes load on ``nodes``: the step every rank restored (the same on all, each
    rank's whole state exactly that step's, or as built with none), and rank 0's log."""
    for old in tmp.glob("out-*.json"):
        old.unlink()
    procs = start(tmp, "resume", nodes, cell)
    try:
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0] * len(procs), logs(tmp, "resume")[-4000:]
    finally:
        for p in procs:
            p.kill()
    outs = [json.loads((tmp / f"out-{r}.json").read_text()) for r in range(len(nodes))]
    assert len({o["step"] for o in outs}) == 1, outs           # never a mix of steps
    assert all(o["exact"] for o in outs), (outs, logs(tmp, "resume")[-4000:])
    said = (tmp / "resume-0.log").read_text(errors="replace")
    (tmp / "resume-0.log").rename(tmp / f"resume-0.{len(list(tmp.glob('resume-0.*')))}.log")
    return outs[0]["step"], said


def killed_restore(tmp: Path, nodes: list[str], cell: dict) -> None:
    """A load whose one rank dies at the cell's point; the others, left waiting in a
    collective, are ended as the supervisor would end the step."""
    procs = start(tmp, "resume", nodes, cell)
    try:
        victim = procs[cell["restore_rank"]]
        victim.join(120)
        assert victim.exitcode == -9, (victim.exitcode, logs(tmp, "resume")[-3000:])
    finally:
        for p in procs:
            p.kill()
            p.join(30)


# ---- a node lost at each point of a copy ---------------------------------------------------------
COPY = [
    # (where the lost node's ranks die in the copy of step N, the node, what may be restored)
    ("staged", "n2", {N - 1}),             # staged in node memory, nothing kept yet
    ("checksummed", "n2", {N - 1}),
    ("kept", "n2", {N - 1}),               # own copy whole; the send not begun
    ("header-sent", "n2", {N - 1}),
    ("mid-send", "n2", {N - 1}),           # half of it at the partner: its slot spoiled
    ("unacknowledged", "n2", {N}),         # whole at the partner, the ack unread
    ("acknowledged", "n2", {N}),
    ("slow-send", "n2", {N + 1}),          # N's send cut by the snapshot N+1, which arrives
    ("receiving", "n1", {N - 1, N}),       # the partner's node lost mid-receive
    ("received", "n1", {N - 1, N}),        # ... with the copy whole, before its ack
]


@pytest.mark.slow
@pytest.mark.parametrize("stage,lost,allowed", COPY, ids=[c[0] for c in COPY])
def test_a_node_lost_at_each_point_of_a_copy_resumes_from_a_whole_step(
        tmp_path: Path, stage: str, lost: str, allowed: set[int]) -> None:
    cell = {"copy": stage, "lost": lost}
    lose(tmp_path, cell)
    step, said = resume(tmp_path, [n if n != lost else "n3" for n in BEFORE], cell)
    assert step in allowed, (step, said)
    assert f"peer copies: restoring step {step} from node memory (durable: {DURABLE})" in said
    spare = "n3"
    assert f"on {spare} ranks " in said and "from copies kept on" in said, said


@pytest.mark.parametrize("placement", [AFTER, TORCHRUN], ids=["srun", "torchrun"])
def test_a_node_lost_mid_send_resumes_wherever_the_ranks_are_seated(
        tmp_path: Path, placement: list[str]) -> None:
    """torchrun's rendezvous may seat ranks 0-1 on the spare and 2-3 on the node that
    holds their partners' copies: the copies are found by whose they are, not by who
    sits on the node now."""
    lose(tmp_path, {"copy": "mid-send", "lost": "n2"})
    step, said = resume(tmp_path, placement, {})
    assert step == N - 1, said
    if placement == TORCHRUN:
        assert "on n1 ranks 2-3 from the node's own memory" in said, said
        assert "on n3 ranks 0-1 from copies kept on n1" in said, said


def test_a_send_cut_then_the_node_lost_mid_send_is_said_not_hidden(tmp_path: Path) -> None:
    """The limit of two buffers, measured: the lost node's copy of N was cut by N+1 (a send
    slower than the snapshot interval) and N+1's never arrived, while the survivors' N was
    acknowledged and their N-1 overwritten: no step is whole for every rank. The durable
    step is loaded, and the log says which ranks miss what (and the cut was said when it
    happened, in the training's log)."""
    lose(tmp_path, {"copy": "slow-send", "lost": "n2", "then": "mid-send"})
    step, said = resume(tmp_path, AFTER, {})
    assert step in (DURABLE, N - 1, N + 1), said     # (the survivors' N+1 cut the same way)
    if step == DURABLE:
        assert "no step of which every rank has a whole copy" in said, said
        assert f"loading the durable checkpoint ({DURABLE})" in said, said


@pytest.mark.parametrize("early", [False, True], ids=["mid-send-of-the-next", "at-once"])
def test_a_second_node_lost_soon_after_a_restore_costs_no_more(tmp_path: Path,
                                                              early: bool) -> None:
    """After a restore the restored step lay whole on one node only (a rank that received its
    copy keeps none; the new pairing's partners none): the load snapshots it at once, so a
    second loss, mid-send of the next snapshot (or before it: the load's own copies are
    then what stands) costs no more than the first."""
    lose(tmp_path, {"copy": "mid-send", "lost": "n2"})
    lose(tmp_path, {"copy": "mid-send", "lost": "n1", "early": early}, "again", AFTER)
    step, said = resume(tmp_path, ["n4", "n4", "n3", "n3"], {})
    if early:      # n1 lost at the load: ranks 0-1's copies may not have reached n3
        assert step in (N - 1, DURABLE), said
    else:
        assert step == N - 1, said
        assert "on n4 ranks 0-1 from copies kept on n3" in said, said


# ---- a rank killed at each point of a restore ------------------------------------------------------
RESTORE = [("planning", 0), ("sending", 0), ("decoding", 2), ("applying", 2),
           ("forgetting", 0)]


@pytest.mark.slow
@pytest.mark.parametrize("stage,rank", RESTORE, ids=[c[0] for c in RESTORE])
def test_a_rank_killed_at_each_point_of_a_restore_leaves_the_copies_whole(
        tmp_path: Path, stage: str, rank: int) -> None:
    lose(tmp_path, {"copy": "mid-send", "lost": "n2"})
    killed_restore(tmp_path, AFTER, {"restore": stage, "restore_rank": rank})
    step, said = resume(tmp_path, AFTER, {})
    assert step == N - 1, said


# ---- damaged, missing, foreign ------------------------------------------------------------------
def slot(tmp: Path, node: str, rank: int, step: int) -> Path:
    from hpctrain.checkpoint import peerfile

    (found,) = [c for c in (tmp / "shm").glob(f"hpctrain-*/r1-0-{node}.peer/{rank}.*.copy")
                if (peerfile.read_meta(c) or {}).get("step") == step]
    return found


def test_a_damaged_copy_is_set_aside_and_the_next_whole_step_restored(tmp_path: Path) -> None:
    lose(tmp_path, {"copy": "acknowledged", "lost": "n2"})
    copy = slot(tmp_path, "n1", 2, N)
    with open(copy, "r+b") as fh:
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 0xFF]))
    step, said = resume(tmp_path, AFTER, {})
    assert step == N - 1, said
    assert f"not restoring step {N}, nothing written: rank 2 (n3, its copy on n1): " \
           "checksum mismatch" in said, said
    assert f"restoring step {N - 1} from node memory" in said, said


def test_both_copies_of_a_rank_lost_loads_the_durable_step_and_says_why(tmp_path: Path) -> None:
    lose(tmp_path, {"copy": "acknowledged", "lost": "n2"})
    for copy in (tmp_path / "shm").glob("hpctrain-*/r1-0-n1.peer/3.*.copy"):
        copy.unlink()
    step, said = resume(tmp_path, AFTER, {})
    assert step == DURABLE, said
    assert f"the newest, {N}, is missing for ranks 3: their steps held rank 3: none" in said
    assert f"loading the durable checkpoint ({DURABLE})" in said, said


def test_a_state_laid_out_otherwise_is_refused_on_every_rank_nothing_written(
        tmp_path: Path) -> None:
    """No durable step yet: a refused restore leaves every rank's state exactly as built
    (the same on every rank), not some ranks restored and others fresh."""
    lose(tmp_path, {"copy": "acknowledged", "lost": "n2", "durable": False})
    step, said = resume(tmp_path, AFTER, {"rows": 64})
    assert step is None, said
    assert "the state is laid out otherwise" in said, said
    assert "loading the durable checkpoint (none yet: the state as built)" in said, said


def test_extras_refused_on_one_rank_write_nothing_on_any_and_nobody_hangs(
        tmp_path: Path) -> None:
    from programs.peer_matrix_worker import Custom

    extra = {"extra": Custom(), "extra_rank": 3}
    lose(tmp_path, {"copy": "acknowledged", "lost": "n2", "durable": False, **extra})
    step, said = resume(tmp_path, AFTER, extra)
    assert step is None, said
    assert "rank 3 (n3, its copy on n1): its extras were refused" in said, said


# ---- node memory that cannot kill the job, a directory that is not the user's ------------------------
def plain(tmp: Path, cell: dict | None = None) -> list[dict]:
    (tmp / "ckpt").mkdir(exist_ok=True)
    procs = start(tmp, "plain", BEFORE, cell or {})
    try:
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0] * 4, logs(tmp, "plain")[-4000:]
    finally:
        for p in procs:
            p.kill()
    return [json.loads((tmp / f"out-{r}.json").read_text()) for r in range(4)]


def test_node_memory_too_small_turns_copies_off_with_the_figures_never_a_sigbus(
        tmp_path: Path) -> None:
    """A 3 MB tmpfs as node memory (a container's /dev/shm is 64 MB; a rank's snapshot here
    is 1 MB, its copies need 4): every rank runs to its end (no SIGBUS: the pages are
    reserved when mapped), each rank that found no room says what it needed and what was
    free, and a load says why no step comes from memory."""
    from helpers.ckpt import tmpfs
    from helpers.prereq import require

    with tmpfs(tmp_path / "shm", "3m") as small:
        require(small is not None, "mount -t tmpfs (root in a sandbox that allows mounts)")
        outs = plain(tmp_path)
        said = logs(tmp_path, "plain")
        assert any(o["off"] for o in outs), (outs, said)
        assert "cannot hold this rank's copies: 1.0 MB a buffer, 2 buffers" in said, said
        assert " MB free (" in said and "peer copies off" in said, said
        step, loaded = resume(tmp_path, AFTER, {})
        assert step == DURABLE, loaded


@pytest.mark.parametrize("how", ["others-may-write", "group-may-write", "another-user-s"])
def test_a_planted_directory_for_the_copies_is_refused_and_named(tmp_path: Path,
                                                                  how: str) -> None:
    """n2's directory for the run's copies made before the job by someone else, or open to
    others: no rank keeps copies (one line names the path and why), none is written there,
    the job's snapshots and saves go on."""
    import os

    from helpers import admin

    planted = tmp_path / "shm" / f"hpctrain-{os.geteuid()}" / "r1-0-n2.peer"
    planted.mkdir(parents=True)
    if how == "others-may-write":
        planted.chmod(0o777)
    elif how == "group-may-write":
        planted.chmod(0o770)
    else:
        admin.chown(planted, 65534)
    outs = plain(tmp_path)
    assert [o["peers"] for o in outs] == [False] * 4, outs
    said = (tmp_path / "plain-0.log").read_text()
    why = {"others-may-write": "every user may write in it (mode 777)",
           "group-may-write": "others may write in it (mode 770)",
           "another-user-s": "it is owned by"}[how]
    assert f"peer copies of snapshots off: n2: {planted}: {why}" in said, said
    assert not list(planted.iterdir())
