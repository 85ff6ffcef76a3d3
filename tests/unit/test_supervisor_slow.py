"""Slow nodes in the supervisor, against the fake scheduler (its ranks' heartbeats carry
their own time per step; ``slow:NODE`` halves a node's pace): each ``[health] on_slow``
policy, its job log, ledger and the status it leaves, and no alarm without a slow node."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.supervise import SPARES, asked, supervise

NO_SPARE = {**SPARES, "spare_nodes": 0, "allocation": ("n1", "n2"), "nodelist": "n1,n2",
            "job_nodes": 2, "argv": ("srun", "--nodes=2", "--ntasks=4", "python", "train.py")}
STEPS = [{"steps": 120, "step_s": 0.5}]


def slow_lines(ledger: list[str]) -> list[str]:
    return [line for line in ledger if line.startswith("slow ")]


def test_without_a_spare_a_slow_node_is_reported_and_the_job_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", events=[(10.0, "slow:n2")],
                                            steps=STEPS, **NO_SPARE)
    log = capsys.readouterr().err
    assert (code, verdict["cause"]) == (0, "completed"), log
    [line] = slow_lines(ledger)
    assert "node=n2 factor=2.00" in line and "action=report" in line, line
    assert "slow node n2: every rank on node n2 took 0.5 s of its own per step against " \
           "0.25 s for the other nodes' ranks (2.00x)" in log, log
    assert "nothing done ([health] on_slow = report" in log
    at = float(line.split(" at=")[1].split()[0]) - float(fake.wall(10.0))
    assert at <= 15 + 3 * 2 + 2, f"named {at:.0f} s after the slowdown"
    assert not asked(fake, "requeue") and not asked(fake, "shrink_job")


def test_with_a_spare_a_slow_node_is_replaced_in_the_allocation(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", events=[(10.0, "slow:n2")],
                                            steps=STEPS, **SPARES)
    log = capsys.readouterr().err
    assert (code, verdict["cause"]) == (0, "completed"), log
    assert "action=replace" in slow_lines(ledger)[0], ledger
    assert any(line.startswith("restart cause=node_fail") for line in ledger), ledger
    assert "training step ended: node(s) n2 taken out for slowness" in log, log
    assert "ran slower than the others" in log and "on n1,n3" in log, log
    assert asked(fake, "shrink_job") and not asked(fake, "requeue")
    assert "exclude node=n2 cause=slow restart_count=0" in ledger, ledger


def test_exclude_leaves_it_out_of_the_next_start(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "runtime",
                                            events=[(10.0, "slow:n2"), (60.0, "preempt")],
                                            steps=STEPS, on_slow="exclude", **NO_SPARE)
    assert verdict["cause"] == "preemption", verdict
    assert "action=exclude" in slow_lines(ledger)[0], ledger
    assert asked(fake, "set_excluded") == [("set_excluded", "n2")], fake.calls
    assert not asked(fake, "shrink_job")      # this run went on with it
    assert "job 42 will not run on n2 again (slow)" in capsys.readouterr().err


def test_the_batch_node_is_never_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", events=[(10.0, "slow:n1")],
                                            steps=STEPS, **SPARES)
    assert verdict["cause"] == "completed" and not asked(fake, "shrink_job")
    assert "action=exclude" in slow_lines(ledger)[0], ledger
    assert "it is the batch node" in capsys.readouterr().err


def test_no_slow_node_no_alarm(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", steps=STEPS, **SPARES)
    assert verdict["cause"] == "completed" and slow_lines(ledger) == [], ledger


def test_preflight_leaves_a_node_slow_from_the_start_out_of_the_first_step(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", events=[(0.0, "slow:n2")],
                                            steps=STEPS, preflight=True, **SPARES)
    log = capsys.readouterr().err
    assert verdict["cause"] == "completed", log
    assert "preflight: a 1 s matrix multiply on each node (cpu), GFLOP/s: n1 10, n2 3, " \
           "n3 10" in log, log
    assert "preflight: node n2 is 3.3x slower than the others' median (3 GFLOP/s against " \
           "10); left out of the step: a spare takes its place" in log, log
    assert asked(fake, "start_step") == [("start_step", "n1", "n3")], fake.calls
    [line] = slow_lines(ledger)
    assert "node=n2" in line and "action=replace" in line and "gflops=3" in line, line


def test_preflight_times_an_all_reduce_and_leaves_a_node_that_fails_it_out(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """n2's check fails (its task exits 1: a GPU that errors, say) while the others
    answer: the all-reduce cannot complete without it, and the node is left out of the
    first step, the spare taking its place. All answering: the all-reduce's figures."""
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", events=[(0.0, "sick:n2")],
                                            steps=STEPS, preflight=True, **SPARES)
    log = capsys.readouterr().err
    assert verdict["cause"] == "completed", log
    assert "preflight's srun said: srun: error: n2: task 1: Exited with exit code 1" in log
    assert "the all-reduce across the 3 node(s) did not run or did not complete" in log, log
    assert "preflight: node n2 did not answer the preflight (no rate within 120 s, or its " \
           "check failed); left out of the step: a spare takes its place" in log, log
    assert asked(fake, "start_step") == [("start_step", "n1", "n3")], fake.calls
    [line] = slow_lines(ledger)
    assert "node=n2" in line and "factor=0.00" in line and "action=replace" in line, line
    supervise(tmp_path / "ok", "runtime", steps=STEPS, preflight=True, **SPARES)
    assert "preflight: an all-reduce across 3 node(s) took 2 ms (4 GB/s bus bandwidth)" in \
        capsys.readouterr().err


def test_preflight_without_a_spare_goes_on_and_a_requeue_leaves_the_node_out(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Two nodes, no spare, ``on_slow = "exclude"``: n2 is slow from the start; the run
    goes on with it (never worse off than without the check), a preemption's requeue
    leaves it out. (Left out, the policy without a spare is report: nothing excluded.)"""
    code, fake, verdict, ledger = supervise(tmp_path, "runtime",
                                            events=[(0.0, "slow:n2"), (30.0, "preempt")],
                                            steps=STEPS, preflight=True,
                                            on_slow="exclude", **NO_SPARE)
    log = capsys.readouterr().err
    assert "no spare is left: the run goes on with it" in log, log
    assert verdict["cause"] == "preemption", log
    assert "action=exclude" in slow_lines(ledger)[0]
    assert ("set_excluded", "n2") in asked(fake, "set_excluded"), fake.calls


def test_a_preflight_that_cannot_run_judges_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", events=[(0.0, "slow:n2")],
                                            steps=STEPS, preflight=True,
                                            **{**SPARES, "allocation": ("n1",),
                                               "nodelist": "n1", "job_nodes": 1, "nodes": 1,
                                               "spare_nodes": 0, "world": 2})
    assert verdict["cause"] == "completed" and slow_lines(ledger) == [], ledger
