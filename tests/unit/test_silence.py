"""The progress channel gone silent (hpctrain.supervisor.silence): ranks whose datagrams
never reach the board, over real UDP and real relays, told from a script that sends none
by the sign each node's relay leaves; the job log's line; the records the fallback reads
from this node's disk. The devcluster run is tests/cluster/test_watchdog_cluster.py's."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from hpctrain import protocol as p
from hpctrain.protocol import channel
from hpctrain.protocol.dialog import Attempt
from hpctrain.protocol.records import Sign
from hpctrain.runtime.relay import from_env
from hpctrain.supervisor.board import Board
from hpctrain.supervisor.silence import UNHEARD_MIN_S, Silence, message, unheard_nodes


def record(rank: int, node: str, attempt: int = 0) -> dict[str, object]:
    return {"run_id": "r1", "restart_count": 0, "attempt": attempt, "rank": rank,
            "node": node, "step": 3, "phase": "training", "changed_at": f"{time.time():.3f}",
            "beat_at": f"{time.time():.3f}"}


def test_a_node_is_silent_once_its_sign_stood_some_beats_and_nothing_came() -> None:
    seen = {"n1": 100.0, "n2": 100.0, "n3": 108.0}
    assert unheard_nodes(seen, {"n2"}, 100.0 + UNHEARD_MIN_S, 1.0) == ("n1",)
    assert unheard_nodes(seen, {"n2"}, 100.0 + UNHEARD_MIN_S - 1, 1.0) == ()
    assert unheard_nodes(seen, set(), 100.0 + 5 * 4.0, 4.0) == ("n1", "n2")   # 5 beats of 4 s
    signs = {"n1": Sign.parse({"host": "10.0.0.9", "port": "41234", "beat_s": "2",
                               "error": "[Errno 101] Network is unreachable"})}
    assert message(("n1",), signs, "n2", 41234, "32768-60999", 10.4, "the job log") == (
        "no progress datagram from the ranks on n1 has reached the supervisor on n2 (UDP "
        "port 41234) in 10 s, though they send one every 2 s (to 10.0.0.9:41234; sending "
        "failed: [Errno 101] Network is unreachable): UDP between the compute nodes is "
        "blocked. Allow UDP from the partition's nodes to n2, ports 32768-60999 (the "
        "supervisor takes an ephemeral port each run; docs/site.md). Meanwhile hang "
        "detection watches the job log")


def test_datagrams_that_never_arrive_are_told_from_a_script_that_sends_none(
        tmp_path: Path) -> None:
    board = Board()
    dropped = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)   # bound, never read: a
    dropped.bind(("127.0.0.1", 0))                               # firewall's black hole
    state = tmp_path / "state"
    base = {p.STATE_DIR: str(state), channel.TOKEN: board.token,
            channel.LOCAL_DIR: str(tmp_path / "shm"), channel.HOST: "127.0.0.1"}
    try:
        # n1 (this node) sends where nothing is read; n2 reaches the board
        blocked = from_env({**base, channel.PORT: str(dropped.getsockname()[1])},
                           "r1", 0, "n1", 1.0)
        works = from_env({**base, channel.PORT: str(board.port)}, "r1", 0, "n2", 1.0)
        assert blocked is not None and works is not None
        for relay, node in ((blocked, "n1"), (works, "n2")):
            p.write_record(p.rank_file(relay.local, p.PROGRESS, int(node[1]) - 1),
                           record(int(node[1]) - 1, node))
            relay.tick()
        end = time.monotonic() + 5
        while not board.records() and time.monotonic() < end:
            time.sleep(0.02)
        heard = {r.node for r in board.records().values()}
        assert heard == {"n2"} and blocked.sent == 1
        signs = sorted(path.name for path in (state / channel.SIGNS).iterdir())
        assert signs == ["r0-n1", "r0-n2"]          # one per node, written as it first sent

        env = {channel.LOCAL_DIR: str(tmp_path / "shm")}
        silence = Silence(state, "r1", 0, 1.0, "n1", board.port, env)
        assert silence.look(heard, 2, now=50.0) == "" and not silence.on
        said = silence.look(heard, 2, now=50.0 + UNHEARD_MIN_S)
        assert said.startswith("no progress datagram from the ranks on n1 has reached the "
                               f"supervisor on n1 (UDP port {board.port}) in 10 s, though "
                               f"they send one every 1 s (to 127.0.0.1:"
                               f"{dropped.getsockname()[1]})"), said
        assert said.endswith(f"watches the records rank(s) 0 keep on this node's local disk "
                             f"({blocked.local})"), said
        assert silence.on and silence.silent == ("n1",)
        assert silence.look(heard, 2, now=100.0) == ""      # said once
        # the fallback: this node's ranks, from its disk, of the attempt asked for
        assert list(silence.local_records(Attempt("r1", 0, 0))) == [0]
        assert silence.local_records(Attempt("r1", 0, 1)) == {}

        # a script that sends nothing signs nothing: never called silent
        quiet = Silence(tmp_path / "other", "r1", 0, 1.0, "n1", board.port, env)
        assert quiet.look(set(), 2, now=0.0) == "" and quiet.look(set(), 2, now=500.0) == ""
        assert not quiet.on
        # the next run's supervisor clears this run's signs
        Silence(state, "r1", 1, 1.0, "n1", board.port, env)
        assert list((state / channel.SIGNS).iterdir()) == []
    finally:
        dropped.close()
        board.close()
