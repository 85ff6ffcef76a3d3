"""The in-process restart dialog's clocks nest (hpctrain.protocol.timeouts), and each side
uses the one table: a rank waits for the supervisor's word longer than the supervisor may
take to hear every rank arrive and decide."""

from __future__ import annotations

import pytest

from hpctrain.protocol import timeouts as t
from hpctrain.slurm.client import DEFAULT_TIMEOUT_S


def test_the_clocks_nest() -> None:
    assert t.nested() == []
    # the decision asks Slurm for the job, then for its nodes' health: each bounded
    assert t.DECIDE_S >= 2 * DEFAULT_TIMEOUT_S
    assert t.RESUME_WAIT_S > t.ARRIVE_S + t.DECIDE_S


def test_a_broken_nesting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(t, "RESUME_WAIT_S", 70.0)
    assert any("RESUME_WAIT_S=70.0 must exceed" in b for b in t.nested())


def test_the_supervisors_side_reads_the_one_table() -> None:
    from hpctrain.supervisor import inprocess

    assert (inprocess.ARRIVE_S, inprocess.LEAVE_S) == (t.ARRIVE_S, t.LEAVE_S)


@pytest.mark.torch      # the rank's side imports torch: required, never skipped in CI
def test_the_ranks_side_reads_the_one_table() -> None:
    from hpctrain.runtime import restart

    assert (restart.RESUME_WAIT_S, restart.RESUME_POLL_S) == (t.RESUME_WAIT_S, t.RESUME_POLL_S)
