"""The supervisor itself, driven through a whole run against a recorded stand-in of Slurm,
the step and the clock (tests/helpers/fake_scheduler.py): script kind x event, in
milliseconds per cell. Each cell asserts what the devcluster tests assert of the same run
(tests/cluster/test_supervisor_cluster.py and its neighbours, which prove the stand-in
right): the batch step's exit code, the verdict, the ledger, and what was asked of Slurm.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hpctrain import protocol as p
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import Caught
from hpctrain.supervisor.run import Supervisor
from hpctrain.supervisor.watchdog import Limits
from helpers.fake_scheduler import GRACE_S, KINDS, T0, FakeSlurm
from helpers.supervise import BUDGET, SPARES, asked, supervise

ALL = list(KINDS)
STOP_CODE = {"runtime": 75, "inprocess": 75, "torchrun": 1, "srun": 143}   # on a TERM


@pytest.mark.parametrize("kind", ALL)
def test_a_run_that_finishes(tmp_path: Path, kind: str) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, kind)
    assert (code, verdict["cause"], verdict["action"]) == (0, "completed", "finish")
    assert ledger == [] and not asked(fake, "requeue") and fake.now < 15


@pytest.mark.parametrize("kind", ALL)
def test_preemption_mid_run_is_requeued_before_slurm_would(tmp_path: Path, kind: str) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(4.0, "preempt")])
    assert (code, verdict["cause"], verdict["action"]) == (0, "preemption", "requeue"), verdict
    assert ledger == ["requeue cause=preemption restart_count=1 by=supervisor"]
    assert len(asked(fake, "requeue")) == 1 and fake.now < 4.0 + GRACE_S
    assert verdict["status"] == str(STOP_CODE[kind])
    if kind == "runtime":   # it saved on the signal and left with preemption's code
        assert p.read_record(p.state_dir(tmp_path, "42") / p.EXIT)["cause"] == "preemption"


@pytest.mark.parametrize("kind", ALL)
def test_the_time_limit_warning_stops_the_step_and_requeues(tmp_path: Path, kind: str) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(4.0, "warn")])
    assert (code, verdict["cause"], verdict["action"]) == (0, "time_limit", "requeue"), verdict
    assert ledger == ["requeue cause=time_limit restart_count=1 by=supervisor"]
    # the stop passed on: TERM under torchrun (its agent passes nothing else on), else
    # the job's own signal; the ranks were told why
    want = "TERM" if kind == "torchrun" else "USR2"
    assert asked(fake, "signal_steps") == [("signal_steps", want)]
    notice = p.read_record(p.state_dir(tmp_path, "42") / p.STOP)
    assert (notice["cause"], notice["signal"]) == ("time_limit", "USR2")


@pytest.mark.parametrize("kind", ALL)
def test_a_warning_that_never_came_is_taken_as_received_at_the_lead(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Slurm's warning was lost (sent before the script listened): at the lead by Slurm's
    EndTime (60 s limit, 30 s lead) the step is stopped as if it had come."""
    code, fake, verdict, ledger = supervise(tmp_path, kind, steps=({"steps": 100},),
                                            time_limit_s=60.0)
    assert (code, verdict["cause"], verdict["action"]) == (0, "time_limit", "requeue"), verdict
    assert ledger == ["requeue cause=time_limit restart_count=1 by=supervisor"]
    want = "TERM" if kind == "torchrun" else "USR2"
    assert asked(fake, "signal_steps") == [("signal_steps", want)]
    assert 30.0 <= fake.now < 40.0, fake.now
    assert "Slurm's did not come: taking it as received" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ALL)
def test_scancel_is_final(tmp_path: Path, kind: str) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(4.0, "scancel")])
    assert (verdict["cause"], verdict["action"]) == ("cancelled", "finish"), verdict
    assert code == STOP_CODE[kind] and not asked(fake, "requeue") and ledger == []


@pytest.mark.parametrize("kind", ALL)
def test_the_time_limit_itself_is_requeued_at_once(tmp_path: Path, kind: str) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(4.0, "time_limit")])
    assert (code, verdict["cause"], verdict["action"]) == (0, "time_limit", "requeue"), verdict
    # requeued as soon as the TERM came, not after the step ended: KillWait may be short
    assert ledger == ["requeue cause=time_limit restart_count=1 by=supervisor"]
    assert fake.calls.index(("requeue",)) < len(fake.calls) - 1


@pytest.mark.parametrize("kind", ALL)
def test_a_crash_ends_the_job_and_names_the_rank(tmp_path: Path, kind: str) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, kind, steps=[{"crash_at": 3}])
    assert (verdict["cause"], verdict["action"]) == ("user_crash", "finish"), verdict
    assert code == KINDS[kind].crash_code and ledger == [] and not asked(fake, "requeue")
    assert verdict["rank"] == ("1" if kind != "torchrun" else "") and verdict["node"] == "n1"
    if kind == "runtime":
        assert verdict["error"] == "RuntimeError: simulated crash"


@pytest.mark.parametrize("kind", ALL)
def test_a_lost_node_is_left_to_slurm_and_kept_out(tmp_path: Path, kind: str) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(4.0, "node_loss")])
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "leave"), verdict
    assert ledger == ["requeue cause=node_fail restart_count=1 by=slurm",
                      "exclude node=n1 cause=node_fail restart_count=0"]
    assert asked(fake, "set_excluded") == [("set_excluded", "n1")]
    assert not asked(fake, "requeue") and code == 1


@pytest.mark.parametrize("kind", ALL)
def test_a_preemption_during_start_up_is_requeued_without_a_step(tmp_path: Path,
                                                                  kind: str) -> None:
    """The batch shell caught Slurm's TERM before the supervisor took over (its trap
    noted it in HPCTRAIN_EARLY_SIGNALS); Slurm shows the preemption."""
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(0.0, "preempt")],
                                            early=(Caught("TERM", T0, early=True),))
    assert (code, verdict["cause"], verdict["action"]) == (0, "preemption", "requeue")
    assert ledger == ["requeue cause=preemption restart_count=1 by=supervisor"]
    assert not asked(fake, "start_step")


def test_a_hang_is_restarted_in_place_then_the_job_completes(tmp_path: Path) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", steps=[{"hang_at": 3}, {}],
                                            limits=Limits(hang_s=10, beat_s=2.0))
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    assert len(fake.started) == 2 and asked(fake, "kill_steps")
    assert len(ledger) == 1 and ledger[0].startswith(
        "restart cause=hang restart_count=0 attempt=1 ")
    assert "phase=training ranks=-" in ledger[0]


def test_a_rank_that_gave_up_in_a_collective_ends_the_step_as_a_hang_not_a_crash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without runtime.run: a rank's collective timeout (collective_timeout_s <= the hang
    timeout) ends the step before the watchdog sees the hang. Its crash record says it
    waited (waited=1): a hang, restarted in place, not a user crash ending the job."""
    code, fake, verdict, ledger = supervise(
        tmp_path, "runtime", steps=[{"crash_at": 3, "waited": True}, {}],
        limits=Limits(hang_s=10, beat_s=2.0, collective_s=5))
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    assert len(fake.started) == 2 and not asked(fake, "kill_steps")
    assert len(ledger) == 1 and ledger[0].startswith(
        "restart cause=hang restart_count=0 attempt=1 "), ledger
    assert "HANG: no progress in phase training" in capsys.readouterr().err


def test_a_requeue_past_its_limit_stops_the_job_before_it_starts(tmp_path: Path) -> None:
    state = p.state_dir(tmp_path, "42")
    state.mkdir(parents=True)
    p.write_record(state / p.IDENTITY, {"run_id": "r1", "cluster": "dev", "job": "42"})
    (state / p.LEDGER).write_text("".join(
        f"requeue cause=preemption restart_count={n} by=supervisor\n" for n in range(1, 7)))
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", restart_count=6)
    assert (code, verdict["action"], verdict["limit"]) == (1, "stop", "max_requeues=5")
    assert ledger[-1] == "stop cause=preemption restart_count=6 limit=max_requeues=5"
    assert asked(fake, "forbid_requeue") and not asked(fake, "start_step")


def test_a_requeue_nobody_counted_is_entered_from_sacct(tmp_path: Path) -> None:
    """Run 1 starts after Slurm requeued run 0 itself (its node was lost): no ledger line,
    no verdict of run 0; sacct's NODE_FAIL names it."""
    fake_state = p.state_dir(tmp_path, "42")
    fake_state.mkdir(parents=True)
    p.write_record(fake_state / p.IDENTITY, {"run_id": "r1", "cluster": "dev", "job": "42"})
    code, fake, verdict, ledger = supervise(tmp_path, "srun", restart_count=1)
    assert code == 0 and ledger[0] == "requeue cause=requeued restart_count=1 by=slurm"
    assert asked(fake, "run_states")


def test_the_controller_down_during_a_requeue_is_waited_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "srun", events=[(4.0, "warn")],
                                            outage=("requeue", 15.0))
    assert (code, verdict["action"]) == (0, "requeue")
    assert ledger == ["requeue cause=time_limit restart_count=1 by=supervisor"]
    assert len(asked(fake, "requeue")) > 1 and fake.now > 4.0 + 15.0
    assert "scontrol requeue 42: the controller does not answer" in capsys.readouterr().err


def test_a_failed_health_check_requeues_without_the_node_for_free(tmp_path: Path) -> None:
    fake = FakeSlurm(KINDS["srun"], tmp_path / "job.log")
    fake.run_on_nodes = lambda argv, nodes, timeout: (  # type: ignore[method-assign]
        "gpu-check: GPU 1 fell off the bus\nsrun: error: n1: task 0: Exited with exit code 1\n")
    config = Config(argv=("launcher",), key="42", restart_count=0, cluster="dev",
                    launcher="srun", requeue_signal="USR2", budget=BUDGET, base=str(tmp_path),
                    nodelist="n1", job_nodes=1, health_check=("gpu-check",))
    supervisor = Supervisor(config, fake)
    assert supervisor.run() == 0
    state = p.state_dir(tmp_path, "42")
    verdict = p.read_record(state / p.OUTCOME)
    assert (verdict["cause"], verdict["action"], verdict["node"]) == \
        ("health_check", "requeue", "n1")
    assert (state / p.LEDGER).read_text().splitlines() == [
        "requeue cause=health_check restart_count=1 by=supervisor",
        "exclude node=n1 cause=health_check restart_count=0"]
    assert not asked(fake, "start_step")


# ---- restarts in the running processes (hpctrain.runtime.run) ------------------------------
CRASH_ONCE = replace(BUDGET, per_cause={**BUDGET.per_cause, "user_crash": 1})


def test_a_crash_restarts_in_its_processes_within_the_budget(tmp_path: Path) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "inprocess", steps=[{"crash_at": 3}],
                                            budget=CRASH_ONCE)
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    assert len(asked(fake, "start_step")) == 1 and fake.started[0].attempt == 1
    assert len(ledger) == 1 and ledger[0].startswith(
        "restart cause=user_crash restart_count=0 attempt=1 ") and "mode=inprocess" in ledger[0]
    # the crash record was read for the decision, then cleared for the next attempt
    assert not (p.state_dir(tmp_path, "42") / p.EXIT).exists()


def test_a_crash_past_its_budget_ends_the_job_as_before(tmp_path: Path) -> None:
    """max_crash_restarts = 0 (given): the ranks are told to stop, leave with their
    exception, and the job ends FAILED naming the rank, as without runtime.run."""
    code, fake, verdict, ledger = supervise(tmp_path, "inprocess", steps=[{"crash_at": 3}])
    assert (code, verdict["cause"], verdict["action"]) == (1, "user_crash", "finish")
    assert (verdict["rank"], verdict["error"]) == ("1", "RuntimeError: simulated crash")
    # the word reached the ranks through their node's relay (the state dir holds none)
    assert fake.started[-1].asked(p.RESUME)["action"] == "stop"
    assert not (p.state_dir(tmp_path, "42") / p.RESUME).exists()
    assert ledger == [] and len(asked(fake, "start_step")) == 1


DEFAULT_CRASHES = replace(BUDGET, per_cause={c: n for c, n in BUDGET.per_cause.items()
                                            if c != "user_crash"})   # the spec left it out


def test_a_crash_under_runtime_run_is_restarted_by_default(tmp_path: Path) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "inprocess", steps=[{"crash_at": 3}],
                                            budget=DEFAULT_CRASHES)
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    assert len(ledger) == 1 and "mode=inprocess" in ledger[0] and " crash=3:" in ledger[0]
    assert len(asked(fake, "start_step")) == 1


def test_a_plain_scripts_crash_is_not_restarted_by_default(tmp_path: Path) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", steps=[{"crash_at": 3}],
                                            budget=DEFAULT_CRASHES)
    assert (code, verdict["cause"], verdict["action"]) == (1, "user_crash", "finish")
    assert ledger == [] and len(asked(fake, "start_step")) == 1


def test_the_same_crash_at_the_same_step_twice_ends_the_job_as_not_transient(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "inprocess",
                                            steps=[{"crash_at": 3, "every": True}],
                                            budget=DEFAULT_CRASHES)
    assert (code, verdict["cause"], verdict["action"]) == (1, "user_crash", "finish"), verdict
    assert verdict["why"].startswith("crashed twice at step 3 with the same error: not "
                                     "transient"), verdict
    assert (verdict["rank"], verdict["error"]) == ("1", "RuntimeError: simulated crash")
    assert len(ledger) == 1 and " crash=3:" in ledger[0]   # one restart, then the rule
    assert "crashed twice at step 3 with the same error" in capsys.readouterr().err


def test_a_hang_is_interrupted_and_restarted_in_its_processes(tmp_path: Path) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, "inprocess", steps=[{"hang_at": 3}],
                                            limits=Limits(hang_s=10, beat_s=2.0))
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    assert len(asked(fake, "start_step")) == 1 and not asked(fake, "kill_steps")
    assert len(ledger) == 1 and ledger[0].startswith(
        "restart cause=hang restart_count=0 attempt=1 ") and "mode=inprocess" in ledger[0]
    assert "phase=training" in ledger[0]


def test_a_rank_that_cannot_leave_gets_a_restart_in_new_processes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1 stays in its collective (stuck in C): the others are told to stop, their
    launcher ends the step, and the step starts again in new processes (as before)."""
    code, fake, verdict, ledger = supervise(tmp_path, "inprocess",
                                            steps=[{"crash_at": 3, "stuck": 1}, {}],
                                            budget=CRASH_ONCE)
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    assert len(asked(fake, "start_step")) == 2 and not asked(fake, "kill_steps")
    assert len(ledger) == 1 and ledger[0].startswith("restart cause=user_crash ")
    assert "mode=" not in ledger[0]
    assert "not every rank left attempt 0 in its process" in capsys.readouterr().err


def test_a_preemption_while_ranks_are_awaited_is_taken_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1 crashes at 3 s and rank 0 stays in its collective (stuck in C): the supervisor
    waits up to ARRIVE_S (15 s) for both to leave the attempt. A preemption at 5 s is taken
    during that wait (issue 41: the supervisor's waits take signals), not after it: Slurm's
    grace time (10 s on the devcluster) would be over by then."""
    code, fake, verdict, ledger = supervise(tmp_path, "inprocess",
                                            steps=[{"crash_at": 3, "stuck": 1}, {}],
                                            events=[(5.0, "preempt")], budget=CRASH_ONCE)
    assert verdict["cause"] == "preemption", verdict
    err = capsys.readouterr().err
    caught, waited = err.find("caught SIGTERM (preemption)"), err.find("not every rank left")
    assert 0 <= caught < waited, err
    assert len(asked(fake, "start_step")) == 1, "no restart of a preempted job's step"


def test_a_device_error_restarts_in_new_processes_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1's attempt failed of a CUDA error (sticky: its device context is unusable):
    it says its process cannot start another attempt, so the ranks are told to stop at once
    (no 15 s wait) and the step starts again in new processes, within the crash budget."""
    code, fake, verdict, ledger = supervise(tmp_path, "inprocess",
                                            steps=[{"crash_at": 3, "device_error": True}, {}],
                                            budget=CRASH_ONCE)
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    assert len(asked(fake, "start_step")) == 2 and not asked(fake, "kill_steps")
    assert len(ledger) == 1 and ledger[0].startswith("restart cause=user_crash ")
    assert "mode=" not in ledger[0]
    err = capsys.readouterr().err
    assert "not restarting attempt 0 in its processes: a rank's process cannot (a device " \
           "error)" in err, err
    assert fake.started[1].started < 3 + 5, "no wait for ranks that cannot restart"


def test_ranks_that_gave_up_in_a_collective_are_a_hang_of_the_one_they_waited_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """collective_timeout_s (5 s) < hang_timeout_s (10 s): rank 1 stops at step 3, rank 0
    gives up waiting for it in the all-reduce (its word: timeout). That is no crash of
    rank 0's but the hang of rank 1: named, counted as a hang, restarted in place."""
    code, fake, verdict, ledger = supervise(
        tmp_path, "inprocess", steps=[{"hang_at": 3, "hung_rank": 1}],
        limits=Limits(hang_s=10, beat_s=2.0, collective_s=5))
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    assert len(asked(fake, "start_step")) == 1 and not asked(fake, "kill_steps")
    assert len(ledger) == 1 and ledger[0].startswith(
        "restart cause=hang restart_count=0 attempt=1 ") and "mode=inprocess" in ledger[0]
    err = capsys.readouterr().err
    assert "stopped first: rank(s) 1 on n1 (the others gave up waiting for them in a " \
           "collective)" in err, err
    assert "limit 5 s" in err, err


def test_a_derived_hang_timeout_finds_a_hang_in_ten_steps_time(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    """hang_timeout_s left out: once five steps were timed (1 s each), a step that does
    not come is a hang after 30 s (the floor; ten steps would be 10 s), not 300 s."""
    code, fake, verdict, ledger = supervise(
        tmp_path, "inprocess", steps=[{"hang_at": 8, "steps": 12}],
        limits=Limits.from_spec(None, None, None, 2.0))
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    assert len(ledger) == 1 and ledger[0].startswith("restart cause=hang ")
    err = capsys.readouterr().err
    assert "(limit 30 s)" in err, err


def test_a_rank_waited_for_that_does_not_answer_is_frozen_and_not_waited_for_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As above, but rank 1 answers no stack request (SIGSTOP): its attempt cannot be left
    in its process, so the step is killed and the job requeued without its node."""
    code, fake, verdict, ledger = supervise(
        tmp_path, "inprocess", steps=[{"hang_at": 3, "hung_rank": 1, "frozen": 1}],
        limits=Limits(hang_s=10, beat_s=2.0, collective_s=5))
    assert asked(fake, "kill_steps") and len(asked(fake, "start_step")) == 1
    assert verdict["cause"] == "hang" and verdict["action"] == "requeue", verdict
    assert "rank 1: no stacks" in capsys.readouterr().err


# ---- [elastic] spare nodes: 2 nodes x 2 ranks and a spare --------------------------------
@pytest.mark.parametrize("kind", ["runtime", "inprocess"])
def test_a_lost_node_is_taken_from_the_job_and_replaced_by_the_spare(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """n2's ranks go silent at 5 s: found within the silence limit (3 beats, at least 6 s),
    n2 taken from the job before Slurm would mark it DOWN (26 s), the step started again on
    n1 and the spare n3, the job completes in the same run."""
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(5.0, "lose:n2")],
                                            steps=[{"steps": 40}], **SPARES)
    assert (code, verdict["cause"]) == (0, "completed"), verdict
    starts = asked(fake, "start_step")
    assert starts == [("start_step", "n1", "n2"), ("start_step", "n1", "n3")]
    assert asked(fake, "shrink_job") == [("shrink_job", "n1,n3")]
    shrunk_at = fake.calls.index(("shrink_job", "n1,n3"))
    assert shrunk_at < fake.calls.index(("start_step", "n1", "n3"))
    assert fake.started[1].started - 5.0 < 10.0          # found and restarted in < 10 s
    # Slurm marked n2 DOWN while the new step ran: no longer the job's, no NODE_FAIL
    assert fake.view.restarts == 0 and fake.node_state["n2"] == "DOWN*"
    assert [line.split()[0] for line in ledger] == ["step", "restart", "exclude", "step"]
    assert "cause=node_fail" in ledger[1] and ledger[2].startswith("exclude node=n2 ")
    assert "nodes=n1,n3 gpus=4" in ledger[3]
    err = capsys.readouterr().err
    assert "4 rank(s) on n1,n3 (spare: none)" in err, err


def test_a_lost_node_whose_peers_fail_in_their_processes_is_still_taken_before_slurm(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under hpctrain.runtime.run the survivors fail of their lost peers before n2 is found
    silent: they cannot all arrive for an in-process restart, are told to leave, and srun
    waits on for n2's tasks. The silence found meanwhile still takes n2 from the job and
    ends the step before Slurm marks n2 DOWN (26 s): the step restarts on the spare in the
    same run (the devcluster's CI run found the leaving step waiting for Slurm instead)."""
    code, fake, verdict, ledger = supervise(tmp_path, "inprocess",
                                            events=[(5.0, "lose-peers:n2")],
                                            steps=[{"steps": 40}], **SPARES)
    err = capsys.readouterr().err
    assert (code, verdict["cause"]) == (0, "completed"), (verdict, err)
    assert "the ranks on n2 went silent: no attempt in place" in err, err
    assert asked(fake, "shrink_job") == [("shrink_job", "n1,n3")]
    assert fake.view.restarts == 0, "no NODE_FAIL: n2 was no longer the job's"
    assert fake.started[1].started - 5.0 < 15.0, fake.started[1].started


def test_a_second_loss_without_a_spare_is_requeued_and_the_lost_nodes_never_return(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """n2, then n3 once the step runs there: no spare left, so the job is requeued (never
    worse off than without spares); n2 is never placed again in the run."""
    code, fake, verdict, ledger = supervise(
        tmp_path, "runtime", events=[(5.0, "lose:n2"), (25.0, "lose:n3")],
        steps=[{"steps": 60}], **SPARES)
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "requeue"), verdict
    assert asked(fake, "start_step") == [("start_step", "n1", "n2"), ("start_step", "n1", "n3")]
    assert asked(fake, "shrink_job") == [("shrink_job", "n1,n3"), ("shrink_job", "n1")]
    assert fake.view.restarts == 1 and asked(fake, "requeue")
    assert "no spare node is left" in verdict["detail"], verdict
    assert "node_fail" in ledger[-1] and ledger[-1].startswith("requeue ")


def test_without_a_heartbeat_a_lost_node_is_slurms_node_fail_as_without_spares(
        tmp_path: Path) -> None:
    """A plain torchrun script reports no progress: nothing is silent, Slurm marks n2 DOWN
    26 s later and requeues the job itself (row slurm-requeued), as it would without spares."""
    code, fake, verdict, ledger = supervise(tmp_path, "torchrun",
                                            events=[(5.0, "lose:n2")],
                                            steps=[{"steps": 60}], **SPARES)
    assert not asked(fake, "shrink_job") and fake.view.restarts == 1
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "leave"), verdict


@pytest.mark.parametrize("lag_s", [2.0, 60.0])
def test_a_node_fail_requeue_is_named_so_while_sacct_has_not_recorded_it(
        tmp_path: Path, lag_s: float) -> None:
    """Slurm requeued the job for a lost node but slurmdbd has not recorded the run's end yet
    (sacct still calls it RUNNING; CI saw this once in the devcluster's second loss). A short
    lag is waited out (sacct's NODE_FAIL names it); a long one leaves the supervisor's own
    word: the step's node it found lost. Never a bare "requeued" that status then shows."""
    code, fake, verdict, ledger = supervise(tmp_path, "runtime",
                                            events=[(5.0, "lose:n2")],
                                            steps=[{"steps": 60}], sacct_lag_s=lag_s,
                                            **{**SPARES, "spare_nodes": 0,
                                               "allocation": ("n1", "n2"),
                                               "nodelist": "n1,n2", "job_nodes": 2})
    assert fake.view.restarts == 1
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "leave"), verdict
    assert ledger[0] == "requeue cause=node_fail restart_count=1 by=slurm", ledger


def test_the_live_summary_for_status_is_rank_0s_record_and_no_progress_file_is_shared(
        tmp_path: Path) -> None:
    """The progress came over the channel; the state directory (shared storage) holds
    only the supervisor's summary of rank 0 for `hpctrain status`, no per-rank files."""
    code, fake, verdict, ledger = supervise(tmp_path, "runtime", steps=[{"steps": 30}])
    state = p.state_dir(tmp_path, "42")
    summary = p.read_record(state / p.SUMMARY)
    assert summary["rank"] == "0" and summary["phase"] in {"startup", "training"}, summary
    assert not (state / p.PROGRESS).exists()
