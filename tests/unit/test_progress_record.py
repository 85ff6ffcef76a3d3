"""The rank's progress record, typed (hpctrain.protocol.progress): what the runtime's
reporter writes is what the supervisor's board parses, field for field, and anything else
is dropped once, at the board, never read by string key further in."""

from __future__ import annotations

import pytest

from hpctrain.protocol.dialog import Attempt
from hpctrain.protocol.progress import NEWS, Progress
from hpctrain.runtime.progress import Reporter


def test_what_the_reporter_writes_the_board_reads_back_whole(tmp_path) -> None:
    reporter = Reporter(str(tmp_path), 3, node="n2", run_id="r9", restart_count=2, attempt=1)
    reporter.inprocess = True
    reporter.set_step(17)
    reporter.fail("timeout", "DistBackendError: gloo timed out")
    fields = reporter.record()
    assert all(isinstance(v, str) for v in fields.values())     # the wire form: strings
    got = Progress.parse(fields)
    assert got is not None and got.fields() == fields
    assert (got.rank, got.address, got.node, got.step) == (3, Attempt("r9", 2, 1), "n2", "17")
    assert (got.phase, got.failed, got.inprocess, got.final) == \
        ("restarting", "timeout", True, True)
    assert got.exit == "" and got.flushed is None
    reporter.ended("return")
    assert Progress.parse(reporter.record()).flushed is None    # said, not yet flushed
    reporter.flushed = True
    last = Progress.parse(reporter.record())
    assert (last.exit, last.flushed, last.phase) == ("return", True, "exiting")


def test_json_numbers_and_left_out_clocks_parse_the_same() -> None:
    """A datagram's JSON may carry numbers; the summary for `hpctrain status` has no beat."""
    got = Progress.parse({"rank": 0, "run_id": "r", "restart_count": 1, "attempt": 0,
                          "changed_at": 5.5, "step": 4})
    assert got is not None and (got.rank, got.address.restart_count, got.step) == (0, 1, "4")
    assert (got.changed_at, got.beat_at, got.phase) == (5.5, 0.0, "training")


@pytest.mark.parametrize("fields", [
    {}, {"rank": "x"}, {"rank": "-1"}, {"rank": "1", "beat_at": "soon"},
    {"rank": "1", "attempt": "two"}, {"rank": "1", "boundaries": "1.5"}])
def test_what_is_not_a_record_is_none(fields: dict[str, str]) -> None:
    assert Progress.parse(fields) is None


def test_a_later_beat_or_a_later_attempt_replaces_a_rank_record() -> None:
    def rec(attempt: int, beat: float) -> Progress:
        return Progress(0, Attempt("r", 0, attempt), changed_at=0.0, beat_at=beat)
    assert rec(0, 2.0).newer_than(rec(0, 1.0)) and rec(0, 1.0).newer_than(rec(0, 1.0))
    assert not rec(0, 1.0).newer_than(rec(0, 2.0))          # a late datagram
    assert rec(1, 1.0).newer_than(rec(0, 2.0))              # the clock stepped back


def test_news_names_real_fields_and_the_one_match_rule_compares_addresses() -> None:
    fields = Progress(1, Attempt("r", 0, 2), 0.0, 0.0, exit="crash", flushed=False,
                      inprocess=True, wrapped=True, failed="crash").fields()
    assert set(NEWS) <= set(fields)
    this = Attempt("r", 0, 2)
    assert this.matches(fields) and Progress.parse(fields).address == this
    assert not this.matches({**fields, "attempt": "1"})
    assert not this.matches({**fields, "restart_count": "x"})


def test_a_crashs_position_is_the_scripts_step_else_counted_from_its_checkpoint(tmp_path) -> None:
    """What the repeated-crash rule compares: ``ctx.step`` when the script says it; else
    the checkpoint step the attempt resumed from (the job's first attempt: 0) plus the step
    boundaries since; unknown (None) in an attempt that loaded nothing through the
    checkpoint manager, never a count from another origin."""
    reporter = Reporter(str(tmp_path), 0, run_id="r", restart_count=0, attempt=0)
    assert reporter.position() == 0                      # the job's first attempt: from 0
    for _ in range(20):
        reporter.boundary()
    assert reporter.position() == 20
    reporter.new_attempt(1)                              # runtime.run: the next attempt
    assert reporter.position() is None                   # nothing loaded: no origin
    reporter.boundary()
    assert reporter.position() is None                   # ...however many boundaries
    reporter.resumed(20)                                 # loaded the step-20 save
    assert reporter.position() == 20                     # crashed before its first boundary
    reporter.boundary()
    assert reporter.position() == 21
    reporter.set_step(7)                                 # the script's own word wins
    assert reporter.position() == 7
    requeued = Reporter(str(tmp_path / "b"), 0, run_id="r", restart_count=1, attempt=0)
    assert requeued.position() is None                   # a new process of a later run
    requeued.resumed(30)                                 # load_latest, load, load_deepspeed
    assert requeued.position() == 30


def test_a_boundary_in_the_history_says_its_step_counted_from_the_checkpoint(tmp_path) -> None:
    """``report`` tells a step re-done after a restart from a new one by the history's
    step: a script that never says it gets the count from the checkpoint its attempt
    loaded (a shrink's new steps, 28.., read as the first attempt's 1.. by the count of
    boundaries alone, and 23 of them as re-done)."""
    from hpctrain import protocol

    first = Reporter(str(tmp_path), 0, run_id="r", restart_count=0, attempt=0)
    for _ in range(3):
        first.boundary()
    later = Reporter(str(tmp_path), 0, run_id="r", restart_count=0, attempt=1)
    later.resumed(2)
    later.boundary()
    first.drain()
    later.drain()
    steps = [(e["attempt"], e["step"], e["n"]) for e in protocol.read_history(tmp_path)
             if e.get("event") == "step"]
    assert steps == [(0, 1, 1), (0, 2, 2), (0, 3, 3), (1, 3, 1)], steps
