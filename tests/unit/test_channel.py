"""The progress channel (hpctrain.protocol.channel): the ranks' records reach the
supervisor's board over real UDP through one relay per node, the supervisor's requests
reach the ranks through the node directory, and nothing is written to the state directory
while a job trains."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hpctrain import protocol as p
from hpctrain.protocol import channel
from hpctrain.runtime import progress
from hpctrain.runtime.relay import Relay
from hpctrain.supervisor.board import Board


def wait_for(check, timeout: float = 5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError("not within the timeout")


def relay_for(board: Board, tmp_path: Path, node: str, beat_s: float = 0.0) -> Relay:
    env = {**board.env(), channel.LOCAL_DIR: str(tmp_path / "shm")}
    addr = channel.address(env)
    assert addr == ("127.0.0.1", board.port)
    return Relay(channel.node_dir(env, "r1", 0, node), addr, board.token, node, beat_s)


def record(rank: int, node: str, **extra: object) -> dict[str, object]:
    return {"run_id": "r1", "restart_count": 0, "attempt": 0, "rank": rank, "node": node,
            "step": 3, "phase": "training", "changed_at": f"{time.time():.3f}",
            "beat_at": f"{time.time():.3f}", **extra}


def test_a_message_needs_the_jobs_token_and_a_sane_body() -> None:
    data = channel.encode("secret", channel.RECORDS, node="n1", records=[])
    assert channel.decode("secret", data)["node"] == "n1"
    assert channel.decode("other", data) is None
    assert channel.decode("", channel.encode("", channel.RECORDS)) is None
    assert channel.decode("secret", b"not zlib") is None


def test_a_node_with_many_ranks_is_split_into_datagrams_that_fit() -> None:
    rows = [record(r, "n1", error="x" * 200) for r in range(130)]
    grams = channel.records_messages("t", "n1", rows, relay=True)
    assert len(grams) == 3 and all(len(g) < channel.MAX_DATAGRAM for g in grams)
    ranks = [int(r["rank"]) for g in grams for r in channel.decode("t", g)["records"]]
    assert ranks == list(range(130))


def test_the_address_is_slurms_launch_node_unless_the_site_says(tmp_path: Path) -> None:
    env = {channel.PORT: "4000", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7"}
    assert channel.address(env) == ("10.0.0.7", 4000)
    assert channel.address({**env, channel.HOST: "ib0-host"}) == ("ib0-host", 4000)
    assert channel.address({}) is None
    here = channel.node_dir({channel.LOCAL_DIR: str(tmp_path)}, "r/1", 2, "n../x")
    assert here.parent == tmp_path / f"hpctrain-{os.getuid()}" and "/" not in here.name


def test_one_datagram_per_node_brings_every_ranks_record(tmp_path: Path) -> None:
    board = Board()
    relays = [relay_for(board, tmp_path, f"n{i}") for i in range(2)]
    for i, relay in enumerate(relays):
        for rank in range(4 * i, 4 * i + 4):
            p.write_record(p.rank_file(relay.local, p.PROGRESS, rank), record(rank, f"n{i}"))
        relay.tick()
    records = wait_for(lambda: len(board.records()) == 8 and board.records())
    assert sorted(records) == list(range(8)) and records[5].node == "n1"
    assert board.received == 2 and [r.sent for r in relays] == [1, 1]


def test_one_relay_per_node_and_another_takes_over_when_it_leaves(tmp_path: Path) -> None:
    board = Board()
    first, second = relay_for(board, tmp_path, "n1"), relay_for(board, tmp_path, "n1")
    p.write_record(p.rank_file(first.local, p.PROGRESS, 0), record(0, "n1"))
    first.tick()
    second.tick()
    assert first.held and not second.held and (first.sent, second.sent) == (1, 0)
    first.release()          # its rank's work is over (or its process died)
    second.tick()
    assert second.held and second.sent == 1


def test_requests_reach_the_node_directory_and_are_repeated_until_cleared(
        tmp_path: Path) -> None:
    board = Board()
    relay = relay_for(board, tmp_path, "n1")
    p.write_record(p.rank_file(relay.local, p.PROGRESS, 0), record(0, "n1"))
    relay.tick()
    wait_for(board.records)
    board.request(p.DUMP, {"run_id": "r1", "restart_count": 0, "attempt": 0, "seq": "1.5"})
    wait_for(lambda: (relay.tick(), (relay.local / p.DUMP).exists())[1])
    assert p.read_record(relay.local / p.DUMP)["seq"] == "1.5"
    (relay.local / p.DUMP).unlink()           # lost: the reply to the next beat brings it
    relay._written.clear()
    relay.tick()
    wait_for(lambda: (board.drain(), relay.tick(), (relay.local / p.DUMP).exists())[2])
    board.clear(p.DUMP)
    board.request(p.RESUME, {"run_id": "r1", "restart_count": 0, "attempt": 1,
                             "action": "go"})
    wait_for(lambda: (relay.tick(), (relay.local / p.RESUME).exists())[1])


def test_a_forged_or_stale_record_does_not_replace_a_newer_one(tmp_path: Path) -> None:
    board = Board()
    relay = relay_for(board, tmp_path, "n1")

    def send(token: str, *records: dict) -> None:
        relay._send(channel.records_messages(token, "n1", list(records), relay=False))
    send(board.token, record(0, "n1", beat_at="200.0", phase="exited"))
    wait_for(board.records)
    send(board.token, record(0, "n1", beat_at="100.0", phase="training"))   # late
    send("not-the-token", record(1, "n1"))
    time.sleep(0.2)
    assert board.records()[0].phase == "exited" and 1 not in board.records()


def test_a_ranks_reporter_sends_through_the_channel_and_leaves_shared_storage_alone(
        tmp_path: Path) -> None:
    """The runtime's own reporter, started as in a job: its beats reach the board, its
    urgent word at once, and the state directory (shared storage) gets no progress: only
    the sign, once, that the node's ranks send (hpctrain.supervisor.silence reads it)."""
    board = Board()
    state = tmp_path / "state"
    state.mkdir()
    env = {p.STATE_DIR: str(state), p.RUN_ID: "r1", p.HEARTBEAT_S: "0.2",
           channel.LOCAL_DIR: str(tmp_path / "shm"), **board.env()}
    reporter = progress.start_from_env(env, 3, "n1")
    try:
        assert reporter is not None and reporter.relay is not None
        reporter.set_step(7)
        reporter.boundary()
        got = wait_for(lambda: 3 in board.records() and board.records()[3].step == "7"
                       and board.records())
        assert got[3].phase == "training"
        reporter.fail("crash", "RuntimeError: boom")      # news: sent before the next beat
        wait_for(lambda: board.records()[3].failed == "crash")
        board.request(p.RESUME, {"run_id": "r1", "restart_count": 0, "attempt": 1,
                                 "action": "go"})
        wait_for(lambda: p.read_record(reporter.request_path(p.RESUME)).get("action"))
        assert sorted(x.name for x in state.iterdir()) == [channel.SIGNS]
        sign = p.read_record(channel.sign_path(state, 0, "n1"))
        assert (sign["node"], sign["port"], sign["error"]) == ("n1", str(board.port), "")
        assert [x.name for x in (state / channel.SIGNS).iterdir()] == ["r0-n1"]
    finally:
        reporter.exited(True)
        reporter.leave_node()
    assert board.records()[3].phase == "exited"
    assert not reporter.local.exists()        # the last rank took the node directory along


# A rank of a plain script (no runtime.run, so no exited()): its process leaves by atexit.
# The relay rank's flush is made slow (the role held for 0.6 s, as when a loaded machine
# stops that process mid-flush), and the other rank's process outlives its leave by 1 s
# (another atexit handler), so that the relay looks at the other's record while it lives.
LEAVER = """
import atexit, os, sys, time
from pathlib import Path
from hpctrain.runtime import progress
rank, go = int(sys.argv[1]), Path(sys.argv[2])
if rank == 1:
    atexit.register(time.sleep, 1.0)         # runs after the reporter's leave (LIFO)
reporter = progress.start_from_env(os.environ, rank, "n1")
reporter.set_step(5)
reporter.boundary()
if rank == 0:
    while not reporter.relay.held:
        reporter.relay.tick()
        time.sleep(0.01)
    send = reporter.relay._send_records
    reporter.relay._send_records = lambda records: (time.sleep(0.6), send(records))
(go.parent / f"ready-{rank}").touch()
while not go.exists():
    time.sleep(0.01)
"""


def test_two_ranks_leaving_at_once_take_the_node_directory_along(tmp_path: Path) -> None:
    """Seen once in 11 full runs (the scale test): the relay rank, slow to give the role up,
    found the other rank still alive; that rank had given up waiting for the role, so
    neither removed the node directory. Each rank's last word still reaches the board."""
    import subprocess
    import sys
    board = Board()
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, p.STATE_DIR: str(state), p.RUN_ID: "r1", p.HEARTBEAT_S: "0.3",
           channel.LOCAL_DIR: str(tmp_path / "shm"), **board.env()}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", LEAVER, str(rank), str(go)], env=env)
             for rank in (0, 1)]
    wait_for(lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 20.0)
    go.touch()
    assert [proc.wait(timeout=20) for proc in procs] == [0, 0]
    local = channel.node_dir(env, "r1", 0, "n1")
    assert not local.exists(), sorted(x.name for x in local.rglob("*"))
    wait_for(lambda: {0, 1} <= set(board.records()))
    assert {r: board.records()[r].step for r in (0, 1)} == {0: "5", 1: "5"}


def test_a_leaving_ranks_heartbeat_does_not_bring_its_node_directory_back(
        tmp_path: Path) -> None:
    """A plain script's rank leaves while its progress thread beats: the thread stops
    first, or a beat writes the record back, or a tick takes the relay role (and the
    directory) back, after the rank removed them."""
    board = Board()
    state = tmp_path / "state"
    state.mkdir()
    env = {p.STATE_DIR: str(state), p.RUN_ID: "r1", p.HEARTBEAT_S: "0.01",
           channel.LOCAL_DIR: str(tmp_path / "shm"), **board.env()}
    reporter = progress.start_from_env(env, 0, "n1")
    assert reporter is not None
    wait_for(lambda: 0 in board.records())
    reporter.leave_node()
    assert not reporter._thread.is_alive()
    time.sleep(0.2)                               # twenty beats' time
    assert not reporter.local.exists()


def test_a_node_directory_others_may_write_in_is_not_used(
        tmp_path: Path, capsys) -> None:
    """/dev/shm is everyone's: a folder under this user's name that others may write in
    (planted) could feed the ranks forged requests. Progress then goes to the state dir."""
    from hpctrain.runtime.relay import from_env
    board = Board()
    env = {**board.env(), channel.LOCAL_DIR: str(tmp_path / "shm")}
    planted = channel.node_dir(env, "r1", 0, "n1").parent
    planted.mkdir(parents=True)
    planted.chmod(0o777)
    assert from_env(env, "r1", 0, "n1", 2.0) is None
    assert "every user may write in it" in capsys.readouterr().err
    planted.chmod(0o700)
    relay = from_env(env, "r1", 0, "n1", 2.0)
    assert relay is not None and relay.local.stat().st_mode & 0o777 == 0o700


def test_a_receive_buffer_too_small_for_every_last_word_is_said() -> None:
    from hpctrain.supervisor.board import buffer_note
    assert buffer_note(8 << 20, 4) == ""
    note = buffer_note(425_984, 8192)
    assert "416 KiB" in note and "8192 ranks" in note and "to 8 MiB" in note


def test_a_forked_child_of_the_relay_neither_keeps_its_lock_nor_speaks(tmp_path: Path) -> None:
    """A DataLoader worker forked from the rank that relays its node: it drops its copy of
    the lock (outliving the rank, it would hold the role and never send) and sends
    nothing; the rank keeps the role."""
    board = Board()
    relay = relay_for(board, tmp_path, "n1")
    relay.tick()
    assert relay.held
    pid = os.fork()
    if pid == 0:                                    # the child
        code = 0 if (not relay.held and relay.flush() is False) else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    other = relay_for(board, tmp_path, "n1")
    other.tick()
    assert relay.held and not other.held             # the parent's lock was not dropped
    relay.release()
    other.tick()
    assert other.held
