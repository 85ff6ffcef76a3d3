"""A lost node is recognised however it dies (issue 42, item 0): the supervisor against the
recorded stand-in (tests/helpers/fake_scheduler.py), death order x script kind x spares.

``die:n2``: n2's processes die first (srun hears "task N: Killed" and ends the step at once;
the others fail of their lost peers), then n2 goes dark: it answers no step. ``kill:n2``: the
same deaths on a node that stays up: a fault of the node (issue 55, item 6), retried on a
spare, or on the same node once. The order where the node goes silent first is
``lose:n2`` (tests/unit/test_supervisor_matrix.py). tests/cluster/test_node_loss_cluster.py
does the same to real devcluster nodes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import SlurmError
from hpctrain.supervisor.scheduler import Slurm
from helpers.fake_scheduler import MESSAGE_S
from helpers.supervise import SPARES, asked, supervise

NO_SPARES = dict(allocation=("n1", "n2"), nodes=2, world=4, nodelist="n1,n2", job_nodes=2,
                 batch_node="n1", argv=("srun", "--nodes=2", "--ntasks=4", "python", "x.py"),
                 where="4 rank(s) on {nodes}, rendezvous n1:20042")


@pytest.mark.parametrize("kind", ["runtime", "inprocess", "torchrun", "srun"])
def test_processes_first_then_dark_is_a_lost_node_and_the_spare_takes_its_place(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: before, the first failure (a survivor's "Connection closed by
    peer") made it a user_crash: FAILED, no spare. Now n2 is asked, answers no step, is
    taken from the job and the step restarts on n1 and the spare n3."""
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(5.0, "die:n2")],
                                            steps=[{"steps": 40}], **SPARES)
    err = capsys.readouterr().err
    assert (code, verdict["cause"]) == (0, "completed"), (verdict, err)
    assert asked(fake, "probe_nodes") == [("probe_nodes", "n2")], fake.calls
    assert "node n2 did not answer a step launched there" in err, err
    assert asked(fake, "shrink_job") == [("shrink_job", "n1,n3")]
    assert asked(fake, "start_step") == [("start_step", "n1", "n2"), ("start_step", "n1", "n3")]
    assert [line.split()[0] for line in ledger] == ["step", "restart", "exclude", "step"]
    assert "cause=node_fail" in ledger[1], ledger
    # taken from the job before Slurm marked it down: the run went on, no NODE_FAIL
    assert fake.view.restarts == 0
    # from the deaths to the new step: srun's MessageTimeout for the probe, and no more
    # (the SETTLE_S given to Slurm to speak passes while the node is asked)
    assert fake.started[1].started - 5.0 < MESSAGE_S + 1.0


@pytest.mark.parametrize("kind", ["runtime", "torchrun", "srun"])
def test_processes_first_without_spares_is_requeued_without_the_node(
        tmp_path: Path, kind: str) -> None:
    """No spare: the job is requeued (node_fail, its own limit) and kept off n2, as Slurm
    would once it marked n2 down, but at once; never a crash."""
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(5.0, "die:n2")],
                                            steps=[{"steps": 40}], **NO_SPARES)
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "requeue"), verdict
    assert "not in place: node(s) n2 answering no step" in verdict["detail"], verdict
    assert asked(fake, "set_excluded") == [("set_excluded", "n2")]
    assert asked(fake, "requeue") and code == 0


@pytest.mark.parametrize("kind", ["runtime", "torchrun", "srun"])
def test_processes_killed_on_a_node_that_answers_are_a_node_fault_the_spare_takes(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The same deaths, but n2 stays up (its GPU's driver killed the processes; an admin's
    kill -9): no rank said a word of its own, so the fault is the node's, not the
    script's. With a spare, n2 is left out and the step
    restarts on n1 and the spare n3 (n2 taken from the job); the job completes."""
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(5.0, "kill:n2")],
                                            steps=[{"steps": 40}], **SPARES)
    err = capsys.readouterr().err
    assert (code, verdict["cause"]) == (0, "completed"), (verdict, err)
    assert asked(fake, "probe_nodes") == [("probe_nodes", "n2")]
    assert "node n2 answered a step: its ranks died there without a word" in err, err
    assert asked(fake, "start_step") == [("start_step", "n1", "n2"), ("start_step", "n1", "n3")]
    # taken from the job all the same: up now, it may go dark next and end the run
    assert asked(fake, "shrink_job") == [("shrink_job", "n1,n3")]
    restart = next(line for line in ledger if line.startswith("restart "))
    assert "cause=node_fail" in restart, ledger
    assert "exclude node=n2 cause=node_fault restart_count=0" in ledger, ledger


@pytest.mark.parametrize("kind", ["runtime", "srun"])
def test_without_a_spare_a_node_fault_is_tried_once_more_in_place_then_left_out(
        tmp_path: Path, kind: str) -> None:
    """No spare: the first wordless death on n2 restarts the step on the same nodes (a
    fault may pass); the second on n2 requeues the job without it (node_fail, excluded)."""
    once = supervise(tmp_path / "once", kind, events=[(5.0, "kill:n2")],
                     steps=[{"steps": 40}], **NO_SPARES)
    code, fake, verdict, ledger = once
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    assert [c[1:] for c in asked(fake, "start_step")] == [("n1", "n2"), ("n1", "n2")]
    assert any("restart cause=node_fail" in line for line in ledger), ledger
    code, fake, verdict, ledger = supervise(
        tmp_path / "twice", kind, events=[(5.0, "kill:n2"), (30.0, "kill:n2")],
        steps=[{"steps": 60}], **NO_SPARES)
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "requeue"), verdict
    assert "not in place: node(s) n2 its ranks died without a word of their own" in \
        verdict["detail"], verdict
    assert asked(fake, "set_excluded") == [("set_excluded", "n2")]


@pytest.mark.parametrize("kind", ["runtime", "srun"])
def test_a_crash_of_its_own_asks_no_node(tmp_path: Path, kind: str) -> None:
    """A rank that raised (or exited 3) failed of its own: no node is asked."""
    code, fake, verdict, ledger = supervise(tmp_path, kind, steps=[{"crash_at": 3}],
                                            **SPARES)
    assert verdict["cause"] == "user_crash", verdict
    assert not asked(fake, "probe_nodes"), fake.calls


def test_the_batch_node_lost_processes_first_is_requeued(tmp_path: Path) -> None:
    """n1 hosts the supervisor and the rendezvous: a step cannot restart without it, so
    even with a spare the job is requeued (here the supervisor outlived its node's
    processes; on a real loss it dies with them and Slurm requeues the job NODE_FAIL)."""
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", events=[(5.0, "die:n1")],
                                            steps=[{"steps": 40}], **SPARES)
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "requeue"), verdict
    assert "the batch node n1 answered no step" in verdict["detail"], verdict


def test_a_stop_signal_while_the_node_is_asked_is_not_kept_waiting(tmp_path: Path) -> None:
    """n2 is asked as soon as the step ends, while Slurm is given its moment to speak: the
    time-limit warning that comes meanwhile is acted on at once (a requeue, its grace
    untouched), not after the lost node's MessageTimeout; the answer is not waited for."""
    code, fake, verdict, ledger = supervise(
        tmp_path, "runtime", events=[(5.0, "die:n2"), (6.0, "warn")],
        steps=[{"steps": 40}], **SPARES)
    assert (verdict["cause"], verdict["action"]) == ("time_limit", "requeue"), verdict
    assert asked(fake, "probe_nodes") == [("probe_nodes", "n2")], fake.calls
    assert not asked(fake, "shrink_job") and code == 0
    assert fake.now < 5.0 + MESSAGE_S, fake.now


def test_asking_nodes_where_srun_cannot_run_says_so(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The real asking (threads, one srun per node): a failure to run srun at all reaches
    the supervisor as Slurm's typed error when it waits for the answers."""
    monkeypatch.setenv("PATH", str(tmp_path))      # no srun here
    probe = Slurm.probe_nodes(["n2", "n3"], 5.0)
    assert probe.nodes == ("n2", "n3")
    with pytest.raises(SlurmError, match="'srun' is not on PATH"):
        probe.answers()


def test_a_probe_that_never_reached_the_node_is_asked_again_not_taken_for_a_loss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """srun failing for the controller ("Unable to contact slurm controller": a failover, a
    busy slurmctld) says nothing of the node: asked again, the node answers. A stand-in srun
    (no controller can be made to fail on cue here) prints Slurm's own line the first
    time; a dead slurmd's line is taken at once; a controller that never answers is said as
    such, not as the node's loss."""
    from hpctrain.slurm import control

    calls = tmp_path / "calls"
    srun = tmp_path / "srun"
    srun.write_text(
        "#!/bin/sh\necho x >> " + str(calls) + "\n"
        "n=$(wc -l < " + str(calls) + ")\n"
        'case "$MODE" in\n'
        "  flaky) [ \"$n\" -ge 2 ] && exit 0 ;;\n"
        "  dead) echo 'srun: error: Task launch for StepId=7.3 failed on node n2: "
        "Communication connection failure' >&2; exit 1 ;;\n"
        "esac\n"
        "echo 'srun: error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("MODE", "flaky")
    assert control.probe_node("n2", timeout=5.0, pause_s=0.1) is None
    assert len(calls.read_text().split()) == 2
    calls.unlink()
    monkeypatch.setenv("MODE", "dead")
    assert "Communication connection failure" in control.probe_node("n2", timeout=5.0,
                                                                     pause_s=0.1)
    assert len(calls.read_text().split()) == 1
    calls.unlink()
    monkeypatch.setenv("MODE", "down")
    said = control.probe_node("n2", timeout=1.0, pause_s=0.2)
    assert said.startswith("the controller did not answer within 1 s (srun: error: Unable")


def test_the_batch_nodes_ranks_killed_twice_requeue_the_job_never_a_step_without_it(
        tmp_path: Path) -> None:
    """n1 hosts the supervisor and the rendezvous: its ranks killed while it answers are
    retried on it once, spare or not; the second time the job is requeued without n1 (a
    step placed on n2 and the spare would rendezvous at a node it left out), and n1 is
    never given back to Slurm while the batch step runs there."""
    code, fake, verdict, ledger = supervise(
        tmp_path, "runtime", events=[(5.0, "kill:n1"), (30.0, "kill:n1")],
        steps=[{"steps": 60}], **SPARES)
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "requeue"), verdict
    assert "the ranks on the batch node n1 died without a word again" in verdict["detail"]
    assert asked(fake, "start_step") == [("start_step", "n1", "n2")] * 2, fake.calls
    assert not asked(fake, "shrink_job")
