"""The live line (issue 43): ``status`` asks the running supervisor for rank 0's newest
step over real UDP (hpctrain.protocol.live, hpctrain.supervisor.live), authenticated by a
secret only the job's user can read, and falls back to the summary file; the wire's rules
(MAC, freshness, replays) without a network."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from hpctrain import protocol as p
from hpctrain.jobs.index import JobEntry
from hpctrain.jobs.poll import JobInfo
from hpctrain.jobs.view import JobStatus, fill_progress, progress_of, wait_progress
from hpctrain.protocol import channel, live
from hpctrain.slurm.states import from_slurm
from hpctrain.supervisor.board import Board
from hpctrain.supervisor.live import LiveServer
from hpctrain.supervisor.statedir import StateDir


def ev(t: float, restart: int, attempt: int, **kw: object) -> dict:
    return {"t": t, "restart": restart, "attempt": attempt, **kw}


def address(secret: bytes = b"s" * 32, key: str = "42") -> live.Address:
    return live.Address(key, "r1", 0, "127.0.0.1", 9, secret)


# ---- the wire ---------------------------------------------------------------------------------
def test_a_request_needs_the_secret_the_job_and_a_fresh_new_nonce() -> None:
    mine, seen, now = address(), {}, 1000.0
    data, nonce = live.request(mine, now)
    assert b"s" * 32 not in data and (b"s" * 32).hex().encode() not in data  # never sent
    assert live.checked_request(mine, data, now + 1, seen) == nonce
    assert live.checked_request(mine, data, now + 2, seen) is None          # played again
    forged, _ = live.request(address(b"x" * 32), now)
    assert live.checked_request(mine, forged, now, {}) is None              # another secret
    other_job, _ = live.request(address(key="43"), now)
    assert live.checked_request(mine, other_job, now, {}) is None
    old, _ = live.request(mine, now - live.FRESH_S - 1)
    assert live.checked_request(mine, old, now, {}) is None                 # too old
    for junk in (b"", b"{}", b"\xff", b'{"nonce": 1}', json.dumps([1]).encode()):
        assert live.checked_request(mine, junk, now, {}) is None
    # nonces older than FRESH_S are forgotten: the cache stays small
    assert live.checked_request(mine, live.request(mine, now + 100)[0], now + 100, seen)
    assert nonce not in seen and len(seen) == 1


def test_an_answer_is_shown_only_with_the_supervisors_mac() -> None:
    mine = address()
    data = live.answer(mine, "n1", {"rank": "0", "step": "7"}, 1000.0)
    assert live.checked_answer(mine, "n1", data) == live.Answer({"rank": "0", "step": "7"},
                                                                 1000.0)
    assert live.checked_answer(mine, "n2", data) is None                    # another request
    assert live.checked_answer(address(b"x" * 32), "n1", data) is None
    tampered = json.loads(data)
    tampered["body"] = tampered["body"].replace('"7"', '"9"')
    assert live.checked_answer(mine, "n1", json.dumps(tampered).encode()) is None


def test_the_address_record_is_the_users_own_0600_file(tmp_path: Path) -> None:
    mine = address()
    old = os.umask(0)            # the most open umask: the record stays 0600
    try:
        live.write_address(tmp_path, mine)
    finally:
        os.umask(old)
    path = tmp_path / p.LIVE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert live.read_address(tmp_path) == mine
    path.chmod(0o640)             # opened up: another user may have written it
    assert live.read_address(tmp_path) is None
    path.chmod(0o600)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / p.LIVE).symlink_to(path)
    assert live.read_address(tmp_path / "elsewhere") is None               # not followed
    path.write_text("host=\nport=x\n")
    assert live.read_address(tmp_path) is None and live.read_address(tmp_path / "no") is None


# ---- the supervisor's server, over real UDP ---------------------------------------------------
def rank0(step: int, attempt: int = 0, run_id: str = "") -> dict[str, object]:
    now = f"{time.time():.3f}"
    return {"run_id": run_id, "restart_count": 0, "attempt": attempt, "rank": 0,
            "node": "n1", "step": step, "boundaries": step + 1, "phase": "training",
            "changed_at": now, "beat_at": now}


def wait_until(check, timeout: float = 5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (found := check()):
            return found
        time.sleep(0.02)
    raise AssertionError("not within the timeout")


@pytest.fixture()
def server(tmp_path: Path):
    state, _ = StateDir.claim(str(tmp_path), "42", 0, "c", "")
    board = Board()
    srv = LiveServer(state, "42", 0, board, "localhost")
    yield srv
    srv.close()
    board.close()


def relay_says(board: Board, record: dict[str, object]) -> None:
    """What a node's relay sends the board (hpctrain.runtime.relay), one datagram."""
    sock = channel.udp_socket()
    for data in channel.records_messages(board.token, "n1", [record], relay=True):
        sock.sendto(data, ("127.0.0.1", board.port))
    sock.close()


def test_the_supervisor_answers_its_users_status_with_the_boards_newest_step(
        server: LiveServer) -> None:
    state = server.state
    found = live.read_address(state.path)
    assert found == server.address and found.host == "localhost"
    assert live.ask([found])["42"].record == {}      # before rank 0 said anything
    relay_says(server.board, rank0(5, run_id="elsewhere"))   # another job's stray record
    relay_says(server.board, rank0(3, run_id=state.run_id))
    wait_until(lambda: live.ask([found])["42"].record.get("step") == "3")
    relay_says(server.board, rank0(4, run_id=state.run_id))
    answer = wait_until(lambda: (a := live.ask([found])["42"]).record.get("step") == "4" and a)
    assert abs(answer.at - time.time()) < 5
    shown = progress_of(state.path, answer)
    assert (shown.line, shown.source, shown.step) == ("step 4 (training)", "supervisor", 4)
    # nobody else gets an answer: not without the secret, not by playing a request again
    assert live.ask([live.Address("42", "", 0, "localhost", found.port, b"x" * 32)],
                    wait_s=0.4) == {}
    answered = server.answered
    data, _ = live.request(found, time.time())
    sock = channel.udp_socket(("127.0.0.1", 0))
    sock.sendto(data, ("127.0.0.1", found.port))
    sock.sendto(data, ("127.0.0.1", found.port))
    wait_until(lambda: server.answered == answered + 1)
    time.sleep(0.2)
    assert server.answered == answered + 1
    sock.close()


def test_a_closed_server_leaves_status_to_the_summary_at_once(server: LiveServer) -> None:
    state = server.state
    server.close()
    assert not (state.path / p.LIVE).exists()
    start = time.monotonic()
    assert wait_progress("42", JobEntry("42", "x", "script", "", checkpoint_dir=str(
        state.path.parents[2]))) == ("", None)
    assert time.monotonic() - start < 0.2       # nothing asked: no record to ask with


# ---- the view: asked at once, the summary for those that do not answer --------------------------
def view_of(key: str, base: Path, state: str = "RUNNING") -> JobStatus:
    return JobStatus(key, JobEntry(key, "x", "script", "", checkpoint_dir=str(base)),
                     JobInfo(key, from_slurm(state)))


def test_status_asks_every_running_supervisor_and_says_where_each_step_came_from(
        server: LiveServer, tmp_path: Path) -> None:
    base = tmp_path
    relay_says(server.board, rank0(12, run_id=server.state.run_id))
    p.write_record(server.state.file(p.SUMMARY), rank0(2, run_id=server.state.run_id))
    # job 43's supervisor is gone: its live record names a port nobody answers on
    gone = p.state_dir(base, "43")
    gone.mkdir(parents=True)
    dead = address(key="43")
    live.write_address(gone, live.Address("43", "r", 0, "127.0.0.1", server.address.port + 1,
                                          dead.secret))
    p.write_record(gone / p.SUMMARY, rank0(7))
    # job 45 has ended: its final summary, its supervisor not asked
    ended = p.state_dir(base, "45")
    ended.mkdir(parents=True)
    p.write_record(ended / p.SUMMARY, {**rank0(39), "phase": "exited"})
    views = [view_of("42", base), view_of("43", base), view_of("44", base, "PENDING"),
             view_of("45", base, "COMPLETED")]
    wait_until(lambda: live.ask([server.address])["42"].record.get("step") == "12")
    start = time.monotonic()
    fill_progress(views)
    assert time.monotonic() - start < live.ASK_S + 0.5     # asked together, not in turn
    assert [(v.progress_step, v.progress_source) for v in views] == [
        (12, "supervisor"), (7, "summary"), (None, ""), (39, "summary")]
    assert views[3].live == "step 39 (exited)"
    start = time.monotonic()
    fill_progress(views[3:])
    assert time.monotonic() - start < 0.2                   # an ended job: nobody asked
    assert views[0].to_json()["progress"] == "step 12 (training)"
    assert views[0].to_json()["progress_source"] == "supervisor"


def test_the_line_reads_rank_0s_record_and_the_rate_from_its_history(tmp_path: Path) -> None:
    assert progress_of(tmp_path, None).line == ""          # no runtime: nothing to say
    state = p.state_dir(tmp_path, "42")
    # the supervisor's summary of rank 0's record (hpctrain.supervisor.hang.Watch.summarize)
    p.write_record(state / p.SUMMARY, {"rank": 0, "restart_count": 1, "attempt": 0,
                                       "step": 17, "phase": "training"})
    lines = [ev(100.0 + i / 2, 1, 0, event="step", step=10 + i, n=i) for i in range(8)]
    lines.insert(0, ev(50.0, 0, 0, event="step", step=3, n=1))   # an earlier run: not counted
    (state / p.HISTORY).write_text("".join(json.dumps(x) + "\n" for x in lines))
    shown = progress_of(state, None)
    assert (shown.line, shown.source) == ("step 17 (training, 2.00 steps/s)", "summary")
    # the supervisor's answer wins over the file; an empty one (rank 0 silent yet) does not
    fresh = live.Answer({"rank": "0", "restart_count": "1", "step": "19"}, time.time())
    assert progress_of(state, fresh).line == "step 19 (training, 2.00 steps/s)"
    assert progress_of(state, live.Answer({}, time.time())).step == 17
    # the script said a step's work: its throughput beside the steps
    said = {**fresh.record, "work": "4096", "work_unit": "tokens"}
    assert progress_of(state, live.Answer(said, time.time())).line == \
        "step 19 (training, 2.00 steps/s, 8,192 tokens/s)"


# ---- the waiting views: Slurm as seldom as before, the step every LIVE_S -------------------------
class Clock:
    """time.monotonic and time.sleep of a waiting view, without the waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_status_watch_on_a_terminal_shows_the_steps_between_slurms_polls(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from hpctrain.commands import status as cmd
    from hpctrain.jobs.listing import Listing
    from hpctrain.jobs.poll import Snapshot

    clock, calls = Clock(), []
    monkeypatch.setattr(cmd.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(cmd.time, "sleep", clock.sleep)

    def collect(job_ids, expand, limit, snap=None):
        calls.append((clock.now, snap is None))     # (when, Slurm asked)
        listing = Listing([], snap or Snapshot({}, "sacct"), [])
        monkeypatch.setattr(listing, "ended", lambda: clock.now >= 10)
        return listing

    monkeypatch.setattr(cmd, "collect", collect)
    # nothing changes: Slurm's second poll is 5 s on, the third 7.5 s after it (backoff)
    for tty, expected in ((True, [(0, True), (2, False), (4, False), (5, True), (7, False),
                                  (9, False), (11, False), (12.5, True)]),
                          (False, [(0, True), (5, True), (12.5, True)])):
        calls.clear()
        clock.now = 0.0
        monkeypatch.setattr(cmd.sys.stdout, "isatty", lambda: tty)
        assert cmd._watch((), True, False, 20, 5.0) == 0
        assert calls == expected
        shown = capsys.readouterr().out.count('"jobs"')
        assert shown == len(expected) if tty else shown == 3   # a log: one per poll


def test_status_watch_backs_off_while_nothing_changes_and_says_when_it_looks_next(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 59: --watch polled sacct every 5 s for as long as it ran. Now, like --wait
    (one backoff rule), half as long again each unchanged poll up to 10 s, 5 s again once
    Slurm's word changes; the footer says when Slurm is asked next."""
    from hpctrain.commands import status as cmd
    from hpctrain.jobs.listing import Listing
    from hpctrain.jobs.poll import Snapshot

    clock, polls = Clock(), []
    words = iter(["PENDING"] * 4 + ["RUNNING"] * 2 + ["COMPLETED"])
    monkeypatch.setattr(cmd.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(cmd.time, "sleep", clock.sleep)
    monkeypatch.setattr(cmd.sys.stdout, "isatty", lambda: False)

    def collect(job_ids, expand, limit, snap=None):
        assert snap is None                     # a log: every table is a poll of Slurm
        polls.append(clock.now)
        word = next(words)
        listing = Listing([], Snapshot({}, "sacct"), [])
        monkeypatch.setattr(listing, "slurm_word", lambda: (("7", word, 0),))
        monkeypatch.setattr(listing, "ended", lambda: word == "COMPLETED")
        return listing

    monkeypatch.setattr(cmd, "collect", collect)
    assert cmd._watch(("7",), False, False, 20, 5.0) == 0
    # pauses 5, 7.5, 10, 10 while PENDING; 5 after the change to RUNNING, then 7.5
    assert polls == [0, 5, 12.5, 22.5, 32.5, 37.5, 45]
    footers = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("next look")]
    assert [f.split(" (")[0] for f in footers] == [
        f"next look at Slurm in {s} s" for s in (5, 8, 10, 10, 5, 8)]
    assert footers[1] == ("next look at Slurm in 8 s (now every 7.5 s: 5 s after a change, "
                          "up to 10 s while nothing changes; Ctrl-C stops)")


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "NaN", "0.5", "0", "3601"])
def test_status_watch_refuses_what_is_not_a_number_of_seconds_it_can_sleep(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """An adversarial run: --watch inf / 1e400 crashed with OverflowError (time.sleep), and
    --watch nan asked Slurm without pause forever (nan passes every comparison). Now each
    is a usage error that names the value and the range, before Slurm is asked."""
    from click.testing import CliRunner

    from hpctrain.commands import status as cmd

    def watch(*_args: object) -> int:
        raise AssertionError("the watch started")

    monkeypatch.setattr(cmd, "_watch", watch)
    res = CliRunner().invoke(cmd.status, ["--watch", value])
    assert res.exit_code == 2, res.output
    assert "Invalid value for '--watch'" in res.output and value in res.output
    assert "1" in res.output and "3600" in res.output


@pytest.mark.parametrize("args, every_s", [(["--watch"], 5.0), (["--watch", "1"], 1.0),
                                           (["--watch=2.5"], 2.5),
                                           (["--watch", "3600"], 3600.0)])
def test_status_watch_takes_seconds_from_1_to_3600(monkeypatch: pytest.MonkeyPatch,
                                                   args: list[str], every_s: float) -> None:
    from click.testing import CliRunner

    from hpctrain.commands import status as cmd

    seen: list[float] = []
    monkeypatch.setattr(cmd, "_watch", lambda *a: seen.append(a[-1]) or 0)
    res = CliRunner().invoke(cmd.status, args)
    assert res.exit_code == 0, res.output
    assert seen == [every_s]


def test_what_counts_as_a_change_for_status_watch() -> None:
    """Slurm's state or requeues of a line, not its elapsed time or step (which move every
    poll and would keep the watch at its shortest interval)."""
    from hpctrain.jobs.listing import Listing
    from hpctrain.jobs.poll import Snapshot

    def word(state: str, elapsed: int, requeues: dict[str, int]) -> tuple:
        info = JobInfo("7", from_slurm(state), state, elapsed_s=elapsed, requeues=requeues)
        view = JobStatus("7", JobEntry("7", "w", "script", "/f"), info, last_step=elapsed)
        return Listing([], Snapshot({}, "sacct"), [view]).slurm_word()

    assert word("RUNNING", 10, {}) == word("RUNNING", 99, {})
    assert word("RUNNING", 10, {}) != word("PENDING", 10, {})
    assert word("RUNNING", 10, {}) != word("RUNNING", 10, {"preemption": 1})


def test_submit_wait_shows_the_step_every_live_s_while_slurm_is_asked_less_often(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from hpctrain.commands import submit as cmd

    clock, lines = Clock(), []
    monkeypatch.setattr(cmd.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(cmd.time, "sleep", clock.sleep)
    monkeypatch.setattr(cmd, "progress_line", lambda job, info: f"{info.state} @{clock.now:g}")
    monkeypatch.setattr(cmd, "exit_code_for", lambda info: 0)
    monkeypatch.setattr("hpctrain.jobs.view.wait_progress", lambda *a, **k: ("step 9", None))
    running, done = JobInfo("7", from_slurm("RUNNING")), JobInfo("7", from_slurm("COMPLETED"))

    class Waiting:
        job_id, cancel_hint, entry = "7", "cancel it", None

        def updates(self, idle):
            yield running, False
            idle(10.0)                   # Slurm's state unchanged: its poll backs off
            yield done, True

    assert cmd._wait(Waiting(), as_json=False) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:6] == ["RUNNING @0", "RUNNING @2", "RUNNING @4", "RUNNING @6", "RUNNING @8",
                       "COMPLETED @10"]
    assert out[-1].startswith("job 7 ended COMPLETED after") and out[-1].endswith("step 9")
