"""The requeue ledger (hpctrain.protocol.ledger): parsing, where it is found, and what
`hpctrain status` makes of it (on the cluster: tests/cluster/test_status_cluster.py). The
supervisor's side is in tests/unit/test_supervisor_*.py and
tests/cluster/test_supervisor_cluster.py."""

from __future__ import annotations

from pathlib import Path

from hpctrain import protocol
from hpctrain.protocol.ledger import line, parse_ledger, read_ledger, requeues_by_cause
from helpers.jobs import LEDGER_LINES as LINES


def test_parse_counts_each_cause_and_keeps_the_stop_line() -> None:
    ledger = parse_ledger(LINES)
    assert ledger.requeues == {"preemption": 2, "node_fail": 1} and ledger.total == 3
    assert ledger.limit == "max_preemptions=2" and ledger.stop["cause"] == "preemption"
    assert (ledger.last_restart, ledger.last_cause) == (3, "preemption")
    empty = parse_ledger("")
    assert empty.requeues == {} and empty.limit is None and empty.last_cause is None
    assert line("requeue", cause="preemption", restart_count=1, by="supervisor") == \
        LINES.splitlines()[0]


def test_a_port_taken_at_start_up_is_a_restart_that_counts_against_no_limit() -> None:
    text = "\n".join([line("restart", cause="hang", restart_count=0, attempt=1),
                      line("restart", cause="port_taken", restart_count=0, attempt=2)])
    ledger = parse_ledger(text)
    assert ledger.restarts == {"hang": 1, "port_taken": 1} and ledger.step_restarts == 1


def test_the_ledger_names_the_causes_unless_it_lags_behind_sacct() -> None:
    ledger = parse_ledger(LINES)   # 3 requeues
    assert requeues_by_cause({"requeued": 2, "node_fail": 1}, ledger) == ledger.requeues
    behind = {"requeued": 2, "node_fail": 2}   # a 4th, not entered by a next run yet
    assert requeues_by_cause(behind, ledger) == behind
    assert requeues_by_cause(behind, None) == behind


def test_read_prefers_the_checkpoint_dir_and_misses_quietly(tmp_path: Path) -> None:
    ckpt, submit = tmp_path / "ckpt", tmp_path / "submit"
    protocol.state_dir(submit, "5").mkdir(parents=True)
    (protocol.state_dir(submit, "5") / "ledger").write_text(
        "requeue cause=time_limit restart_count=1 by=supervisor\n")
    assert read_ledger("5", str(ckpt), str(submit)).requeues == {"time_limit": 1}
    protocol.state_dir(ckpt, "5").mkdir(parents=True)
    (protocol.state_dir(ckpt, "5") / "ledger").write_text(LINES)
    assert read_ledger("5", str(ckpt), str(submit)).total == 3
    assert read_ledger("6", str(ckpt), str(submit)) is None
    assert read_ledger("5", "", str(tmp_path / "nope")) is None


def test_the_ledger_keeps_each_recovered_crashs_signature_in_order() -> None:
    ledger = parse_ledger(
        "restart cause=user_crash restart_count=0 attempt=1 at=5.0 mode=inprocess crash=20:ab\n"
        "restart cause=hang restart_count=0 attempt=2 at=9.0\n"
        "requeue cause=user_crash restart_count=1 by=supervisor crash=31:cd\n")
    assert ledger.crashes == ("20:ab", "31:cd")
    assert ledger.recoveries("user_crash") == 2
