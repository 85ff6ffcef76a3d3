"""The requeue ledger (hpctrain.protocol.ledger): parsing, where it is found, and what
`hpctrain status` makes of it. The supervisor's side is in tests/test_supervisor_*.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain import cli, protocol
from hpctrain.jobs import index
from hpctrain.protocol.ledger import line, parse_ledger, read_ledger, requeues_by_cause
from hpctrain.jobs.index import JobEntry
from jobs_util import isolate

LINES = """requeue cause=preemption restart_count=1 by=supervisor
requeue cause=node_fail restart_count=2 by=slurm
garbage line
requeue restart_count=3
requeue cause=preemption restart_count=3 by=supervisor
stop cause=preemption restart_count=3 limit=max_preemptions=2
"""


def test_parse_counts_each_cause_and_keeps_the_stop_line() -> None:
    ledger = parse_ledger(LINES)
    assert ledger.requeues == {"preemption": 2, "node_fail": 1} and ledger.total == 3
    assert ledger.limit == "max_preemptions=2" and ledger.stop["cause"] == "preemption"
    assert (ledger.last_restart, ledger.last_cause) == (3, "preemption")
    empty = parse_ledger("")
    assert empty.requeues == {} and empty.limit is None and empty.last_cause is None
    assert line("requeue", cause="preemption", restart_count=1, by="supervisor") == \
        LINES.splitlines()[0]


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


@pytest.mark.slurm
def test_status_shows_requeues_by_cause_and_the_limit_that_ended_the_job(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Slurm does not know this id (one cheap poll, no history): the ledger in the job's
    state directory gives the requeues by cause and names the limit, in the table and --json."""
    root = isolate(monkeypatch, tmp_path)
    ckpt = root / "ckpt"
    protocol.state_dir(ckpt, "31338").mkdir(parents=True)
    (protocol.state_dir(ckpt, "31338") / "ledger").write_text(LINES)
    index.append([JobEntry(job_id="31338", name="preempted-a-lot", kind="script",
                              folder=str(root), checkpoint_dir=str(ckpt))])
    assert cli.main(["status", "31338", "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["jobs"][0]
    assert job["requeues"] == {"preemption": 2, "node_fail": 1}
    assert job["requeue_limit"] == "max_preemptions=2"
    assert cli.main(["status", "31338"]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert "node_fail:1 preemption:2" in row and "requeue limit max_preemptions=2 reached" in row
