"""status/logs/cancel without a cluster: bad ids, unknown jobs, and the table's pieces."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain import cli
from hpctrain.commands.jobview import exit_code_for, format_elapsed, format_requeues
from hpctrain.jobs.contract import is_over
from hpctrain.slurm.states import from_slurm
from hpctrain.jobs.poll import JobInfo
from helpers.jobs import isolate


def test_cancel_refuses_what_is_not_a_job_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    assert cli.main(["cancel", "12;rm"]) != 0
    assert "'12;rm' is not a job id" in capsys.readouterr().err


def test_logs_of_a_job_hpctrain_did_not_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    assert cli.main(["logs", "777"]) != 0
    assert "job 777 is not in hpctrain's job index" in capsys.readouterr().err


def test_formatting() -> None:
    assert format_elapsed(None) == "-" and format_elapsed(3725) == "01:02:05"
    assert format_elapsed(90061) == "1-01:01:01"
    assert format_requeues({}) == "-"
    assert format_requeues({"time_limit": 1, "preemption": 2}) == "preemption:2 time_limit:1"


@pytest.mark.parametrize("state,queued,over", [
    ("RUNNING", False, False), ("COMPLETED", False, True), ("FAILED", False, True),
    ("PREEMPTED", True, False),    # requeued: still in the queue, not over
    ("PREEMPTED", False, True),    # not requeued: over
    ("TIMEOUT", True, False), ("NODE_FAIL", False, True), ("REQUEUED", False, False),
])
def test_when_a_job_is_over(state: str, queued: bool, over: bool) -> None:
    assert is_over(JobInfo("1", from_slurm(state)), lambda: queued) is over


def test_exit_codes_for_wait() -> None:
    assert exit_code_for(JobInfo("1", from_slurm("COMPLETED"))) == 0
    for state in ("FAILED", "PREEMPTED", "TIMEOUT", "NODE_FAIL", "CANCELLED"):
        assert exit_code_for(JobInfo("1", from_slurm(state))) != 0
