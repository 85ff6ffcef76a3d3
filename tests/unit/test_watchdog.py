"""The hang watchdog's pure parts: progress records (the runtime's reporter), the
judgement (hpctrain.supervisor.watchdog), the decision rows for hangs and in-place
restarts, and the ledger lines they leave. The devcluster runs are in
tests/cluster/test_watchdog_cluster.py."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpctrain import protocol as p
from hpctrain.protocol.dialog import Attempt
from hpctrain.protocol.ledger import parse_ledger
from hpctrain.protocol.progress import Progress
from hpctrain.protocol.records import ExitRecord
from hpctrain.runtime.progress import Reporter, phase
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.decision import Budget, Facts, InPlace, decide
from hpctrain.supervisor.watchdog import (AUTO_HANG_S, AUTO_SAVE_S, EXIT_GRACE_S, HANG_FLOOR_S,
                                          Limits, StepClock, assess, culprits,
                                          in_collective, innermost, main_stack, node_of,
                                          suspect_ranks, WAITED, gave_up, waited_for)
from helpers.progress import by_rank

NOW = 1_800_000_000.0
LIMITS = Limits(hang_s=10, startup_s=30, save_s=60, beat_s=2.0)


def rank(r: int, *, step: str = "5", boundaries: int = 5, phase: str = "training",
         changed: float = NOW - 1, beat: float = NOW - 1, node: str = "n1") -> Progress:
    return Progress(r, Attempt("run", 0, 0), changed, beat, node=node, step=step,
                    boundaries=boundaries, phase=phase)


# ---- judgement ------------------------------------------------------------------------------
def test_no_hang_while_every_rank_moves_within_its_phase_limit() -> None:
    ranks = {0: rank(0), 1: rank(1, phase="saving", changed=NOW - 50),
             2: rank(2, phase="startup", changed=NOW - 25)}
    assert assess(ranks, 3, NOW - 100, NOW, LIMITS) is None


def test_a_rank_past_its_phase_limit_is_a_hang_and_the_one_behind_is_named() -> None:
    ranks = {0: rank(0, changed=NOW - 12, boundaries=6), 1: rank(1, changed=NOW - 14,
                                                                boundaries=5, node="n2")}
    hang = assess(ranks, 2, NOW - 100, NOW, LIMITS)
    assert hang is not None and hang.phase == "training" and hang.limit_s == 10
    assert (hang.ranks, hang.nodes, hang.why) == ((1,), ("n2",), "behind the other ranks")
    assert round(hang.idle_s) == 14 and hang.detected_at == NOW


def test_a_slow_save_gets_the_save_timeout_not_the_hang_timeout() -> None:
    ranks = {r: rank(r, phase="saving", changed=NOW - 40) for r in range(2)}
    assert assess(ranks, 2, NOW - 100, NOW, LIMITS) is None
    late = assess({r: replace(ranks[r], changed_at=NOW - 61) for r in range(2)}, 2,
                  NOW - 100, NOW, LIMITS)
    assert late is not None and late.phase == "saving" and late.ranks == ()


def test_a_rank_whose_work_is_over_is_not_hung_but_an_exit_that_never_ends_is() -> None:
    # rank 1 left long ago (phase exited): it waits for nobody; rank 0 still trains
    ranks = {0: rank(0, changed=NOW - 5), 1: rank(1, phase="exited", changed=NOW - 500)}
    assert assess(ranks, 2, NOW - 600, NOW, LIMITS) is None
    # every rank's work is over, yet the step runs on: within the grace, then a hang
    done = {r: rank(r, phase="exited", changed=NOW - EXIT_GRACE_S + 1) for r in range(2)}
    assert assess(done, 2, NOW - 600, NOW, LIMITS) is None
    hang = assess(done, 2, NOW - 600, NOW + 2, LIMITS)
    assert hang is not None and (hang.phase, hang.ranks) == ("exited", ())
    assert hang.text().startswith("every rank's work is over, but the step has not ended")
    # the grace counts from the last rank to leave
    late = {**done, 1: rank(1, phase="exited", changed=NOW)}
    assert assess(late, 2, NOW - 600, NOW + 2, LIMITS) is None


def test_a_rank_that_never_reported_is_a_start_up_hang_counted_from_the_step_start() -> None:
    ranks = {0: rank(0, phase="startup", changed=NOW - 20, boundaries=0, step="")}
    assert assess(ranks, 2, NOW - 29, NOW, LIMITS) is None
    hang = assess(ranks, 2, NOW - 31, NOW, LIMITS)
    assert hang is not None and hang.phase == "startup" and hang.ranks == (1,)
    assert hang.why.startswith("never reported")


def test_with_the_channel_silent_only_the_ranks_that_can_be_read_are_judged() -> None:
    """This node's ranks (0, 1) read from its disk; 2 and 3 are out of reach (their node's
    datagrams never arrive): not a start-up hang of theirs, while 0 and 1 still move; a
    hang once those stop, with no rank named as never reporting."""
    moving = {r: rank(r) for r in (0, 1)}
    assert assess(moving, 4, NOW - 100, NOW, LIMITS, watched=set(moving)) is None
    stopped = {r: rank(r, changed=NOW - 12) for r in (0, 1)}
    hang = assess(stopped, 4, NOW - 100, NOW, LIMITS, watched=set(stopped))
    assert hang is not None and hang.phase == "training" and hang.ranks == ()
    # judged as all four, 2 and 3 would be named as never having reported
    blind = assess(stopped, 4, NOW - 100, NOW, LIMITS)
    assert blind is not None and blind.ranks == (2, 3) and "never reported" in blind.why
    done = {r: rank(r, phase="exited", changed=NOW - 5) for r in (0, 1)}
    assert assess(done, 4, NOW - 100, NOW, LIMITS, watched=set(done)) is None


def test_a_frozen_heartbeat_names_its_rank_and_node() -> None:
    ranks = {0: rank(0, changed=NOW - 20), 1: rank(1, changed=NOW - 20, beat=NOW - 30,
                                                    node="n2")}
    hang = assess(ranks, 2, NOW - 100, NOW, LIMITS)
    assert hang is not None and hang.ranks == (1,) and hang.frozen_nodes == ("n2",)


def test_plain_scripts_are_watched_by_output_only_when_asked() -> None:
    auto = Limits.from_spec(None, None, None, 2.0)
    assert assess({}, 2, NOW - 10_000, NOW, auto, output_at=NOW - 5_000) is None
    asked = Limits.from_spec(6, None, None, 2.0)
    assert asked.plain and asked.startup_s == 1800
    assert assess({}, 2, NOW - 100, NOW, asked, output_at=NOW - 5) is None
    hang = assess({}, 2, NOW - 100, NOW, asked, output_at=NOW - 7)
    assert hang is not None and hang.ranks == () and hang.phase == "output"
    assert hang.text() == ("no output from the step for 7 s (limit 6 s; it does not report "
                           "progress through hpctrain.runtime)")
    # before its first output a script gets the start-up timeout
    assert assess({}, 2, NOW - 100, NOW, asked, output_at=None) is None


def test_zero_turns_a_timeout_off() -> None:
    off = Limits.from_spec(0, None, None, 2.0)
    assert (off.hang_s, off.startup_s, off.save_s, off.any) == (None, None, None, False)
    ranks = {0: rank(0, changed=NOW - 10_000)}
    assert assess(ranks, 1, NOW - 10_000, NOW, off) is None


def test_suspects_say_nothing_when_every_rank_stands_at_the_same_place() -> None:
    assert suspect_ranks({r: rank(r) for r in range(4)}, 4, NOW, 2.0) == ((), "")


# ---- a hang timeout derived from the step time ----------------------------------------------
def test_the_step_clock_times_steps_only_while_every_rank_trains() -> None:
    clock = StepClock()
    for i in range(3):
        clock.add(NOW + i, 2 * i)             # 0.5 s a step, two per look
    assert clock.step_s() is None            # 4 steps timed: fewer than MIN_STEPS
    clock.add(NOW + 3, 6)
    assert clock.step_s() == 0.5 and clock.longest_s == 1.0
    clock.skip()                              # a save: the next stretch is not timed
    clock.add(NOW + 30, 9)
    clock.add(NOW + 31, 11)
    assert clock.step_s() == 0.5 and clock.longest_s == 1.0
    clock.add(NOW + 51, 12)                   # 20 s in training, then a step: a pause
    assert clock.longest_s == 20.0 and clock.step_s() == 0.5
    clock.add(NOW + 52, 0)                    # the ranks started over: a new anchor
    assert clock.last == (NOW + 52, 0)
    assert StepClock(known=0.25).step_s() == 0.25   # an earlier attempt's pace


def test_a_derived_timeout_follows_the_step_time_within_its_bounds() -> None:
    auto = Limits.from_spec(None, None, None, 2.0)
    assert auto.timed(None).of("training") == AUTO_HANG_S           # not timed yet
    assert auto.timed(0.5).of("training") == HANG_FLOOR_S           # 10 steps: 5 s
    assert auto.timed(6.0).of("training") == 60.0                   # 10 steps
    assert auto.timed(0.5, pause_s=40.0).of("training") == 120.0    # 3 x a pause seen
    assert auto.timed(60.0).of("training") == AUTO_HANG_S           # capped
    # work between steps, start-up and saves keep their own limits
    assert auto.timed(0.5).of("between-steps") == AUTO_HANG_S
    assert auto.timed(0.5).of("saving") == AUTO_SAVE_S
    # a timeout the spec gave stays as given; one turned off stays off
    assert Limits.from_spec(100, None, None, 2.0).timed(0.5).of("training") == 100
    assert Limits.from_spec(0, None, None, 2.0).timed(0.5).of("training") is None


def test_ranks_that_gave_up_in_a_collective_name_the_rank_they_waited_for() -> None:
    def rec(r: int, phase: str = "training", failed: str = "", beat: float = NOW - 1,
            node: str = "n1") -> dict[str, str]:
        return {"rank": str(r), "node": node, "step": "7", "boundaries": "7", "phase": phase,
                "changed_at": str(NOW - 12), "beat_at": str(beat), "failed": failed}
    timeouts = {0: rec(0, "restarting", "timeout"), 1: rec(1, node="n2"),
                2: rec(2, "restarting", "timeout")}
    hang = waited_for(by_rank(timeouts), 3, NOW, 2.0, 10.0)
    assert hang is not None and (hang.ranks, hang.nodes, hang.limit_s) == ((1,), ("n2",), 10)
    assert hang.phase == "training" and hang.frozen_nodes == () and round(hang.idle_s) == 12
    assert "the others gave up waiting for them in a collective" in hang.text()
    # its heartbeat stopped too: frozen (the attempt cannot be left in its process)
    frozen = {**timeouts, 1: rec(1, node="n2", beat=NOW - 60)}
    assert waited_for(by_rank(frozen), 3, NOW, 2.0).frozen_nodes == \
        ("n2",)   # type: ignore[union-attr]
    # a rank that lost its connection to one that gave up (it tore its group down) waited
    # too, but is not waited for (seen on the devcluster: gloo's "Connection closed by peer")
    lost = {**timeouts, 3: rec(3, "restarting", "peer")}
    assert waited_for(by_rank(lost), 4, NOW, 2.0).ranks == (1,)   # type: ignore[union-attr]
    # one rank crashed on its own: the failure path, not a hang; nor is a peer lost alone
    assert waited_for(by_rank({**timeouts, 2: rec(2, "restarting", "crash")}), 3, NOW, 2.0) is None
    assert waited_for(by_rank({0: rec(0, "restarting", "peer"), 1: rec(1)}), 2, NOW, 2.0) is None
    assert waited_for(by_rank({0: rec(0), 1: rec(1)}), 2, NOW, 2.0) is None
    # without runtime.run the step ended: the crash record says the rank waited; the
    # ranks that never said their work ended are the ones waited for
    ended = {0: {**rec(0, "exited"), "exit": "crash"}, 1: rec(1, node="n2"),
             2: {**rec(2, "exited"), "exit": "crash"}}
    hang = gave_up(ExitRecord.parse({"waited": "1"}), by_rank(ended), 3, NOW, 2.0, 10.0)
    assert hang is not None and (hang.ranks, hang.nodes, hang.why) == ((1,), ("n2",), WAITED)
    assert gave_up(ExitRecord.parse({"error": "RuntimeError: boom"}), by_rank(ended), 3, NOW, 2.0) is None
    silent = gave_up(ExitRecord.parse({"waited": "1"}), by_rank({r: rec(r) for r in range(3)}), 3, NOW, 2.0)
    assert silent is not None and silent.ranks == ()     # nothing to tell them apart


# ---- stacks ---------------------------------------------------------------------------------
WAITING = """rank 0 on n1 (pid 1), step 5, 5 step boundaries, phase training
--- main thread ---
  File "train.py", line 40, in main
    dist.all_reduce(grad)
  File "/venv/torch/distributed/distributed_c10d.py", line 3252, in all_reduce
    work.wait()
--- thread hpctrain-ckpt ---
  File "/usr/lib/python3.11/threading.py", line 327, in wait
"""
SLEEPING = """rank 3 on n2 (pid 4), step 5, 5 step boundaries, phase training
--- main thread ---
  File "train.py", line 38, in main
    time.sleep(3600)
--- thread pin_memory ---
  File "/venv/torch/distributed/foo.py", line 1, in bar
"""


def test_the_rank_outside_the_collective_is_the_culprit() -> None:
    assert in_collective(WAITING) and not in_collective(SLEEPING)   # main thread only
    assert "time.sleep" in main_stack(SLEEPING) and "pin_memory" not in main_stack(SLEEPING)
    assert innermost(SLEEPING) == 'File "train.py", line 38, in main'
    ranks, why = culprits({0: WAITING, 1: WAITING, 2: WAITING, 3: SLEEPING}, 4)
    assert ranks == (3,) and "while rank(s) 0-2 wait in one" in why and "line 38" in why


def test_a_rank_that_reported_but_did_not_answer_is_the_culprit() -> None:
    ranks, why = culprits({0: WAITING, 1: WAITING}, 3, known={0, 1, 2})
    assert ranks == (2,) and why.startswith("did not answer")
    # a rank that never reported could not answer: not named again
    assert culprits({0: WAITING, 1: WAITING}, 3, known={0, 1}) == ((), "")


# ---- the runtime's reporter -------------------------------------------------------------------
def test_the_reporter_writes_progress_and_answers_a_stack_request(tmp_path: Path) -> None:
    reporter = Reporter(str(tmp_path), 2, node="n1", run_id="r1", restart_count=1, attempt=3,
                        beat_s=0.2).start()
    try:
        reporter.set_step(7)
        reporter.boundary()
        with phase("saving"):
            pass   # no module-level reporter: a no-op, never an error
        before = reporter.set_phase("saving")
        assert before == "training"
        time.sleep(1.0)
        record = p.read_record(p.rank_file(tmp_path, p.PROGRESS, 2))
        got = Progress.parse(record)
        assert got is not None and (got.step, got.boundaries, got.phase) == ("7", 1, "saving")
        assert (record["run_id"], record["restart_count"], record["attempt"]) == ("r1", "1", "3")
        # a request for another attempt is not answered; this attempt's is
        p.write_record(tmp_path / p.DUMP, {"run_id": "r1", "restart_count": 1, "attempt": 2,
                                           "seq": "a"})
        time.sleep(0.8)
        assert not p.rank_file(tmp_path, p.STACKS, 2).exists()
        p.write_record(tmp_path / p.DUMP, {"run_id": "r1", "restart_count": 1, "attempt": 3,
                                           "seq": "b"})
        deadline = time.monotonic() + 5
        while not p.rank_file(tmp_path, p.STACKS, 2).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = p.rank_file(tmp_path, p.STACKS, 2).read_text()
        assert text.startswith("seq=b\nrank 2 on n1") and "--- main thread ---" in text
        assert "test_the_reporter_writes_progress" in main_stack(text)
        assert threading.main_thread().is_alive()
    finally:
        reporter.close()


def test_the_reporters_last_word_says_how_the_work_ended_and_then_stays(tmp_path: Path) -> None:
    reporter = Reporter(str(tmp_path), 0, run_id="r1", beat_s=0.1).start()
    reporter.set_step(4)
    path = p.rank_file(tmp_path, p.PROGRESS, 0)
    reporter.ended("return")      # written at once: the process may die in what follows
    record = p.read_record(path)
    assert (record["phase"], record["exit"], record["flushed"]) == ("exiting", "return", "")
    reporter.exited(True)
    assert not reporter._thread.is_alive()
    record = p.read_record(path)
    assert (record["phase"], record["exit"], record["flushed"], record["step"]) == \
        ("exited", "return", "1", "4")
    time.sleep(0.3)
    assert p.read_record(path) == record   # no heartbeat after the last word
    phases = [e["phase"] for e in p.read_history(tmp_path) if e["event"] == "phase"]
    assert phases == ["startup", "exiting", "exited"]


def test_teardown_runs_once_in_order_and_keeps_the_first_word(tmp_path: Path) -> None:
    from hpctrain.runtime.teardown import Teardown

    reporter = Reporter(str(tmp_path), 1, beat_s=0.1).start()
    teardown = Teardown(reporter, 1)
    teardown.mark("crash")
    teardown.mark("requeue")          # the first word that is not "return" wins
    teardown.run()
    teardown.run()                    # once: close(), then the interpreter's exit
    record = p.read_record(p.rank_file(tmp_path, p.PROGRESS, 1))
    assert (record["exit"], record["phase"], record["flushed"]) == ("crash", "exited", "1")
    with pytest.raises(ValueError, match="'bye'"):
        teardown.mark("bye")


def test_rank_0_keeps_a_history_of_steps_and_phases(tmp_path: Path) -> None:
    import json

    first = Reporter(str(tmp_path), 0, run_id="r1", restart_count=2, attempt=1, beat_s=0.2)
    other = Reporter(str(tmp_path), 1, run_id="r1", restart_count=2, attempt=1, beat_s=0.2)
    for reporter in (first, other):
        reporter.start()
        reporter.set_step(4)
        reporter.boundary()
        reporter.set_phase("saving")
        reporter.set_phase("training")
        reporter.close()
    lines = [json.loads(x) for x in (tmp_path / p.HISTORY).read_text().splitlines()]
    assert [(e["event"], e.get("phase"), e.get("step")) for e in lines] == [
        ("phase", "startup", None), ("phase", "training", None), ("step", None, 4),
        ("phase", "saving", None), ("phase", "training", None)]   # rank 0's only
    assert {(e["restart"], e["attempt"]) for e in lines} == {(2, 1)}
    assert all(lines[i]["t"] <= lines[i + 1]["t"] for i in range(len(lines) - 1))


# ---- decisions --------------------------------------------------------------------------------
VIEW = JobView("42", "RUNNING", "None", 0, None, NOW + 3000, True)
BUDGET = Budget(10, {"user_crash": 1, "hang": 2})


def facts(**kw: Any) -> Facts:
    base: dict[str, Any] = dict(restart_count=0, requeue_signal="USR2", budget=BUDGET,
                                requeues={}, view=VIEW, now=NOW, status=137,
                                inplace=InPlace(2, 0))
    return Facts(**{**base, **kw})


def test_a_hang_is_restarted_in_place_then_requeued_then_stopped() -> None:
    hang = "no progress in phase training for 11 s (limit 10 s)"
    first = decide(facts(hang=hang))
    assert (first.action, first.cause) == ("restart", "hang")
    assert first.detail == "in-place restart 1 of max_step_restarts=2"
    spent = decide(facts(hang=hang, inplace=InPlace(2, 2), restarts={"hang": 2}))
    assert (spent.action, spent.cause) == ("requeue", "hang")
    assert "not in place: max_step_restarts=2 spent" in spent.detail
    sick = decide(facts(hang=hang, inplace=InPlace(2, 0, unhealthy={"n2": "DOWN*"})))
    assert sick.action == "requeue" and "n2 DOWN*" in sick.detail
    over = decide(facts(hang=hang, inplace=InPlace(2, 2), requeues={"hang": 2}))
    assert (over.action, over.limit) == ("stop", "max_hangs=2")


def test_slurm_facts_still_win_over_a_hang() -> None:
    preempted = replace(VIEW, preempt_time=NOW - 1)
    assert decide(facts(hang="x", view=preempted)).cause == "preemption"
    assert decide(facts(hang="x", status=0)).cause == "completed"


def test_a_crash_counts_in_place_restarts_and_requeues_against_its_limit() -> None:
    assert decide(facts()).action == "restart"                    # crash 1 of 1, in place
    again = decide(facts(restarts={"user_crash": 1}, inplace=InPlace(2, 1)))
    assert (again.action, again.limit) == ("stop", "max_crash_restarts=1")
    assert "recovery (in place or requeue) 2" in again.detail
    no_retry = replace(BUDGET, per_cause={"user_crash": 0})
    assert decide(facts(budget=no_retry)).action == "finish"      # the default: not retried


# ---- the ledger ------------------------------------------------------------------------------
def test_the_ledger_counts_in_place_restarts_and_excluded_nodes() -> None:
    led = parse_ledger("requeue cause=preemption restart_count=1 by=slurm\n"
                       "restart cause=hang restart_count=1 attempt=1 at=1 ranks=3\n"
                       "restart cause=user_crash restart_count=1 attempt=2 at=2\n"
                       "restart cause=user_crash restart_count=1 attempt=3 at=3 mode=inprocess\n"
                       "exclude node=n2 cause=node_fail restart_count=1\n")
    assert led.requeues == {"preemption": 1} and led.total == 1
    assert led.restarts == {"hang": 1, "user_crash": 2} and led.step_restarts == 3
    assert led.inprocess == {"user_crash": 1}
    assert led.excluded == {"n2": "node_fail"} and led.recoveries("hang") == 1


# ---- py-spy (plain scripts) ---------------------------------------------------------------
# as srun brings it back: each node's lines in order, the two nodes' interleaved (a dump's
# lines are told by their tag; before tags, rank 1's frames landed under rank 0's header)
SPY = """launcher n1 100|
launcher n1 100|Process 100: python -m torch.distributed.run
0 n1 101|
1 n2 102|
0 n1 101|Process 101: python train.py
1 n2 102|Thread 102 (idle): "MainThread"
0 n1 101|Python v3.11.7 (/usr/bin/python3.11)
0 n1 101|
1 n2 102|    main (train.py:68)
0 n1 101|Thread 101 (idle): "MainThread"
0 n1 101|    backward (torch/autograd/__init__.py:353)
1 n2 102|    <module> (train.py:90)
0 n1 101|    backward (torch/_tensor.py:648)
0 n1 101|    main (train.py:71)
srun: error: n3: task 2: Exited with exit code 1
0 n1 101|Thread 140 (idle): "pin_memory"
0 n1 101|    wait (threading.py:327)
3 n2 103|
"""


def test_py_spy_dumps_become_rank_stacks_and_name_the_culprit() -> None:
    from hpctrain.supervisor.response import parse_spy

    stacks = parse_spy(SPY)
    assert sorted(stacks) == [0, 1, 3]                     # the launcher has no rank
    assert stacks[3] == "rank 3 on n2 (pid 103), by py-spy"   # answered, with no stack
    assert stacks[1].startswith("rank 1 on n2 (pid 102), by py-spy")
    assert in_collective(stacks[0]) and not in_collective(stacks[1])
    assert "pin_memory" not in main_stack(stacks[0])
    assert innermost(stacks[1]) == "main (train.py:68)"   # py-spy: innermost first
    assert "<module> (train.py:90)" in stacks[1] and "train.py:90" not in stacks[0]
    # rank 3's dump came back empty: it tells nothing, so it is not named with rank 1
    assert culprits(stacks, 4, known={0, 1, 3})[0] == (1,)
    ranks, why = culprits({r: stacks[r] for r in (0, 1)}, 2)
    assert ranks == (1,) and "rank 1 is at main (train.py:68)" in why
    assert node_of(stacks[1]) == "n2" and node_of(WAITING) == "n1" and node_of("x") == ""


# ---- the partition's health check ------------------------------------------------------------
def test_a_health_check_requeue_is_free_of_the_requeue_budget() -> None:
    tight = Budget(1, {"user_crash": 1, "hang": 1})
    # one earlier requeue was the health check's: a hang may still requeue once
    d = decide(facts(budget=tight, restart_count=1, requeues={"health_check": 1},
                     hang="x", inplace=InPlace(0, 0)))
    assert d.action == "requeue", d
    counted = decide(facts(budget=tight, restart_count=1, requeues={"preemption": 1},
                           hang="x", inplace=InPlace(0, 0)))
    assert (counted.action, counted.limit) == ("stop", "max_requeues=1")


def test_srun_names_every_node_where_the_check_failed() -> None:
    from hpctrain.supervisor.diagnosis import srun_failures

    out = ("gpu-check: GPU 1 fell off the bus\n"
           "srun: error: n2: task 1: Exited with exit code 1\n"
           "srun: error: n4: task 3: Exited with exit code 2\n"
           "srun: error: n1: task 0: Killed\n")
    assert [(f["node"], f["tasks"]) for f in srun_failures(out)] == [("n2", "1"), ("n4", "3")]


def test_rank_lists_in_the_log_fold_runs_so_thousands_fit_a_line() -> None:
    from hpctrain.supervisor.watchdog import ranks_text
    assert ranks_text((0, 1, 3)) == "0,1,3"
    assert ranks_text((5, 0, 1, 2, 7, 8, 9, 10)) == "0-2,5,7-10"
    assert ranks_text(tuple(r for r in range(8192) if r != 4095)) == "0-4094,4096-8191"
    assert ranks_text(()) == ""
