"""The progress channel at scale, without Slurm: what it costs the shared file system and
the supervisor as ranks grow, against the per-rank files it replaced, in one run.

    .venv/bin/python benchmarks/progress_bench.py [--ranks 512,2048,8192] [--json out.json]

1. File events on shared storage (real code, real files): RANKS_PER_NODE x 2 nodes of the
   runtime's own reporters (hpctrain.runtime.progress.Reporter, one thread each, as in a
   rank) beat for --seconds against the supervisor's real board, and inotify counts every
   event under the job's state directory (shared storage in a job). Baseline: the same
   reporters without the channel, writing their records there (the way before).
2. The supervisor's work per look at N ranks (8 per node), simulated: N/8 nodes' datagrams,
   built by the real channel code, sent over UDP to the real board; timed: the board
   taking them, then the watchdog's parse and assessment of every rank (the pure code the
   supervisor runs). Baseline: the same N records as per-rank files, read as the
   supervisor read them before (list the folder, read each).
3. A node's relay: one tick over its 8 ranks' records (tmpfs), and the datagram's size.

Figures are medians of --repeats; ratios are against the baseline of the same run.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))    # the inotify counter the cluster tests use

from hpctrain import protocol as p  # noqa: E402
from hpctrain.protocol import channel  # noqa: E402
from hpctrain.runtime.progress import Reporter  # noqa: E402
from hpctrain.runtime.relay import Relay  # noqa: E402
from hpctrain.supervisor.board import Board  # noqa: E402
from hpctrain.protocol.progress import Progress  # noqa: E402
from hpctrain.supervisor.watchdog import Limits, assess  # noqa: E402
from helpers.inotify import Inotify  # noqa: E402

RANKS_PER_NODE = 8


def file_events(seconds: float, channel_on: bool, beat_s: float) -> float:
    """Events per second under the state directory while 2 nodes' reporters beat."""
    with tempfile.TemporaryDirectory() as tmp:
        state, local = Path(tmp) / "state", Path(tmp) / "shm"
        state.mkdir()
        board = Board() if channel_on else None
        env = {channel.LOCAL_DIR: str(local), **(board.env() if board else {})}
        counter = Inotify(state)
        reporters = []
        for rank in range(2 * RANKS_PER_NODE):
            node = f"n{rank // RANKS_PER_NODE}"
            relay = None
            if board is not None:
                relay = Relay(channel.node_dir(env, "r1", 0, node),
                              ("127.0.0.1", board.port), board.token, node, beat_s)
            reporters.append(Reporter(str(state), rank, node=node, run_id="r1",
                                      beat_s=beat_s, relay=relay).start())
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            for r in reporters:           # the training loop: a step every 0.1 s
                r.set_step((r.step or 0) + 1)
                r.boundary()
            counter.read()
            time.sleep(0.1)
        rate = counter.read() / (time.monotonic() - start)
        seen = len(board.records()) if board else None
        for r in reporters:
            r.close()
            if r.relay:
                r.relay.close()
        if board is not None:
            board.close()
            assert seen == 2 * RANKS_PER_NODE, seen
        return rate


def records(ranks: int, now: float) -> list[dict[str, str]]:
    return [{"run_id": "r1", "restart_count": "0", "attempt": "0", "rank": str(r),
             "node": f"n{r // RANKS_PER_NODE:04d}", "pid": str(10000 + r), "step": "1234",
             "boundaries": "1234", "phase": "training", "changed_at": f"{now - 0.3:.3f}",
             "beat_at": f"{now:.3f}", "inprocess": "1"} for r in range(ranks)]


def judge(recs: dict[int, dict[str, str]], world: int, now: float) -> None:
    parsed = {r: Progress.parse(rec) for r, rec in recs.items()}
    assert assess(parsed, world, now - 100, now, Limits(hang_s=60.0)) is None


def board_look(ranks: int, repeats: int) -> tuple[float, int, int]:
    """(median s per look, datagrams per look, bytes per node datagram)."""
    board = Board()
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    grams = []
    rows = records(ranks, time.time())
    for i in range(0, ranks, RANKS_PER_NODE):
        grams += channel.records_messages(board.token, rows[i]["node"],
                                          rows[i:i + RANKS_PER_NODE], relay=True)
    times = []
    for _ in range(repeats):
        for at in range(0, len(grams), 256):     # in bursts the kernel buffer holds
            for g in grams[at:at + 256]:
                sender.sendto(g, ("127.0.0.1", board.port))
            board.drain()
        t0 = time.perf_counter()
        got = board.records()
        judge(got, ranks, time.time())
        times.append(time.perf_counter() - t0)
        assert len(got) == ranks, (len(got), ranks)
    recv_t = []
    for _ in range(repeats):        # the board taking one beat's datagrams
        t0 = time.perf_counter()
        for at in range(0, len(grams), 256):
            for g in grams[at:at + 256]:
                sender.sendto(g, ("127.0.0.1", board.port))
            board.drain()
        recv_t.append(time.perf_counter() - t0)
    board.close()
    sender.close()
    return (statistics.median(times) + statistics.median(recv_t), len(grams),
            max(len(g) for g in grams))


def files_look(ranks: int, repeats: int) -> float:
    """The way before: every rank's file in one folder, listed and read per look."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / p.PROGRESS
        for rec in records(ranks, time.time()):
            p.write_record(folder / f"rank-{rec['rank']}", rec)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            got = {}
            for path in folder.iterdir():
                rec = p.read_record(path)
                got[int(rec["rank"])] = rec
            judge(got, ranks, time.time())
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


def relay_tick(repeats: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        board = Board()
        relay = Relay(Path(tmp) / "node", ("127.0.0.1", board.port), board.token, "n0", 0.0)
        for rec in records(RANKS_PER_NODE, time.time()):
            p.write_record(p.rank_file(relay.local, p.PROGRESS, int(rec["rank"])), rec)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            relay.tick()
            times.append(time.perf_counter() - t0)
        relay.close()
        board.close()
        return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="512,1024,2048,4096,8192")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--beat", type=float, default=p.DEFAULT_HEARTBEAT_S)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out: dict[str, object] = {}

    before = file_events(args.seconds, False, args.beat)
    after = file_events(args.seconds, True, args.beat)
    out["file_events_per_s"] = {"files": round(before, 2), "channel": round(after, 2)}
    print(f"1. file events/s under the state dir, {2 * RANKS_PER_NODE} ranks on 2 nodes, "
          f"beat {args.beat:g} s, {args.seconds:g} s: per-rank files {before:.1f}, "
          f"channel {after:.2f} ({after / before:.3f}x)")

    rows = []
    for ranks in (int(x) for x in args.ranks.split(",")):
        new, grams, size = board_look(ranks, args.repeats)
        old = files_look(ranks, args.repeats)
        rows.append({"ranks": ranks, "nodes": ranks // RANKS_PER_NODE, "datagrams": grams,
                     "bytes_per_node": size, "board_ms": round(new * 1e3, 2),
                     "files_ms": round(old * 1e3, 2), "ratio": round(new / old, 3)})
    out["supervisor_look"] = rows
    print("2. the supervisor's look (take one beat, parse and judge every rank):")
    print(f"   {'ranks':>6} {'nodes':>6} {'datagrams':>9} {'B/node':>7} {'board ms':>9} "
          f"{'files ms':>9} {'ratio':>6}")
    for r in rows:
        print(f"   {r['ranks']:>6} {r['nodes']:>6} {r['datagrams']:>9} {r['bytes_per_node']:>7}"
              f" {r['board_ms']:>9} {r['files_ms']:>9} {r['ratio']:>6}")
    first, last = rows[0], rows[-1]
    growth = (last["board_ms"] / first["board_ms"]) / (last["ranks"] / first["ranks"])
    print(f"   growth {first['ranks']} -> {last['ranks']} ranks: board x"
          f"{last['board_ms'] / first['board_ms']:.1f} for x{last['ranks'] / first['ranks']:.0f}"
          f" ranks ({growth:.2f} of linear)")
    tick = relay_tick(args.repeats * 10)
    out["relay_tick_ms"] = round(tick * 1e3, 3)
    print(f"3. a node's relay tick over its {RANKS_PER_NODE} ranks: {tick * 1e3:.2f} ms; "
          f"traffic per node: {1 / args.beat:.2f} datagrams/s, "
          f"{rows[0]['bytes_per_node'] / args.beat:.0f} B/s (plus one per news)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
