"""The supervisor's decision table (hpctrain.supervisor.decision), row by row.

Every case issue 11 found with scripts that never heard of hpctrain is a row here, beside
the runtime's own cases. The facts are what the supervisor gathers: the step's exit
status, the stop signals the batch step caught, Slurm's view of the job (as `scontrol show
job` printed it on the devcluster in each situation), the runtime's record and the ledger.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hpctrain.protocol.records import ExitRecord, Verdict
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.decision import (Budget, Caught, Facts, InPlace, budget_text,
                                          crash_signature,
                                          decide, limit_text, missing_requeues,
                                          notice_cause, over_limit, slurm_event)
from hpctrain.supervisor.diagnosis import ABORT_AT_EXIT_FIX, Diagnosis
from hpctrain.supervisor.finish import Finish
from helpers.progress import by_rank

NOW = 1_800_000_000.0
RUNNING = JobView("42", "RUNNING", "None", 0, None, NOW + 3000, True)
# how Slurm showed each event from inside the batch step (devcluster, Slurm 22.05)
PREEMPTING = replace(RUNNING, preempt_time=NOW - 2, end_time=NOW + 8)      # GraceTime runs
CANCELLED = replace(RUNNING, state="COMPLETING", end_time=NOW - 1)         # scancel
TIMED_OUT = replace(RUNNING, state="COMPLETING", reason="TimeLimit", end_time=NOW - 11)
REQUEUED = replace(RUNNING, state="COMPLETING", restarts=1)                 # by Slurm
BUDGET = Budget(10, {"preemption": 10, "time_limit": 10, "node_fail": 3, "user_crash": 0,
                     "storage": 3})


# what the runtime's teardown left in the ranks' progress records: work over, saves durable
FINISHED = Finish(2, {0: "return", 1: "return"}, frozenset({0, 1}), {0: "5", 1: "5"})
ABORTED = Diagnosis(1, "n1", "aborted", ABORT_AT_EXIT_FIX, "srun", "SIGABRT")


def caught(*names: str) -> tuple[Caught, ...]:
    return tuple(Caught(n, NOW - 5 + i) for i, n in enumerate(names))


def facts(**kw: Any) -> Facts:
    base: dict[str, Any] = dict(restart_count=0, requeue_signal="USR2", budget=BUDGET,
                                requeues={}, view=RUNNING, now=NOW)
    return Facts(**{**base, **kw})


ROWS = [
    # --- row slurm-requeued: Slurm requeued the run itself ---------------------------------------------
    ("node lost: Slurm requeued the job, the surviving ranks failed",
     dict(view=REQUEUED, status=1, run_state="NODE_FAIL"), ("leave", "node_fail", 1)),
    ("submitit's own requeue after the warning (the stop notice said time_limit)",
     dict(view=REQUEUED, status=0, caught=caught("USR2"), run_state="REQUEUED",
          notice="time_limit"),
     ("leave", "time_limit", 0)),
    # --- row preempted: preemption is preemption, whatever the step did ----------------------------
    ("plain torchrun DDP preempted on 2 nodes: srun 143", dict(view=PREEMPTING, status=143),
     ("requeue", "preemption", 0)),
    ("plain torchrun preempted on 1 node: torchrun exits 1", dict(view=PREEMPTING, status=1),
     ("requeue", "preemption", 0)),
    ("a script that traps TERM, saves and exits 0 when preempted",
     dict(view=PREEMPTING, status=0), ("requeue", "preemption", 0)),
    ("preempted during start-up: the step never started", dict(view=PREEMPTING),
     ("requeue", "preemption", 0)),
    ("send_user_signal: USR2 to the batch step, the runtime saved (75)",
     dict(view=PREEMPTING, caught=caught("USR2"), status=75), ("requeue", "preemption", 0)),
    # --- row cancelled: a cancellation is never undone ---------------------------------------------
    ("scancel: TERM to the batch step, the ranks died of it", dict(view=CANCELLED, status=143,
                                                                   caught=caught("TERM")),
     ("finish", "cancelled", 143)),
    ("scancel: Lightning's SIGTERM handling stopped the run early and exited 0 (seen on "
     "the devcluster)", dict(view=CANCELLED, status=0, caught=caught("TERM")),
     ("finish", "cancelled", 1)),
    ("scancel after the time-limit warning was caught",
     dict(view=CANCELLED, status=76, caught=caught("USR2", "TERM")), ("finish", "cancelled", 76)),
    # --- row exit-0: exit 0 without preemption is never requeued --------------------------------
    ("the step finished", dict(status=0), ("finish", "completed", 0)),
    ("the step finished right after a caught time-limit warning",
     dict(status=0, caught=caught("USR2")), ("finish", "completed", 0)),
    # --- rows time-limit and warned: the time limit --------------------------------------------------------
    ("the time limit itself: TIMEOUT, TERM to everyone",
     dict(view=TIMED_OUT, status=143, caught=caught("TERM")), ("requeue", "time_limit", 0)),
    ("the warning, then the limit's TERM before the save ended (not cancelled)",
     dict(view=TIMED_OUT, status=143, caught=caught("USR2", "TERM")),
     ("requeue", "time_limit", 0)),
    ("the warning; the runtime saved and exited 76", dict(status=76, caught=caught("USR2")),
     ("requeue", "time_limit", 0)),
    ("the warning; torchrun reports 1 for the runtime's 76", dict(status=1, caught=caught("USR2")),
     ("requeue", "time_limit", 0)),
    ("the warning; a plain script died of it (USR2: 140)", dict(status=140,
                                                                caught=caught("USR2")),
     ("requeue", "time_limit", 0)),
    ("USR1 as requeue.signal", dict(requeue_signal="USR1", status=76, caught=caught("USR1")),
     ("requeue", "time_limit", 0)),
    ("the warning during setup: the step never started", dict(caught=(Caught("USR2", NOW,
                                                                             True),)),
     ("requeue", "time_limit", 0)),
    # --- row stopped: a TERM Slurm does not explain ------------------------------------------------
    ("TERM to the batch step, Slurm saw no preemption, limit or cancel",
     dict(status=75, caught=caught("TERM")), ("finish", "cancelled", 75)),
    ("TERM and the controller cannot be asked", dict(view=None, status=143,
                                                     caught=caught("TERM")),
     ("finish", "unknown", 143)),
    # --- row died-at-exit: every rank finished (its own word), then one died at exit --------------------
    ("torch's gloo group aborts rank 1 at exit; srun reports it (134)",
     dict(status=134, finish=FINISHED, failure=ABORTED), ("finish", "completed", 0)),
    ("the same under torchrun: status 1, its root cause names the signal",
     dict(status=1, finish=FINISHED, failure=replace(ABORTED, source="torchrun")),
     ("finish", "completed", 0)),
    ("srun's own status is the only word on the signal", dict(status=139, finish=FINISHED),
     ("finish", "completed", 0)),
    ("every rank finished, then the exit hung: the watchdog ended it",
     dict(status=137, finish=FINISHED, hang="exit hangs", hang_phase="exited"),
     ("finish", "completed", 0)),
    ("finished, then the script chose to exit 3: not a death", dict(
        status=3, finish=FINISHED, failure=replace(ABORTED, signal=None)),
     ("finish", "user_crash", 3)),
    ("rank 1 crashed: not every rank returned", dict(
        status=134, finish=replace(FINISHED, exits={0: "return", 1: "crash"}),
        failure=ABORTED), ("finish", "user_crash", 134)),
    ("a save failed as the ranks left: something was lost", dict(
        status=134, finish=replace(FINISHED, flushed=frozenset({0})), failure=ABORTED),
     ("finish", "user_crash", 134)),
    ("a plain script aborts at exit: no word from it, reported as it ended",
     dict(status=134, failure=ABORTED), ("finish", "user_crash", 134)),
    ("preempted while the finished ranks left: Slurm's fact first", dict(
        view=PREEMPTING, status=134, finish=FINISHED, failure=ABORTED),
     ("requeue", "preemption", 0)),
    ("scancel while the finished ranks left: never undone", dict(
        view=CANCELLED, status=143, caught=caught("TERM"), finish=FINISHED),
     ("finish", "cancelled", 143)),
    ("the time-limit warning as the finished ranks left: nothing left to save", dict(
        status=1, caught=caught("USR2"), finish=FINISHED,
        failure=replace(ABORTED, signal="SIGTERM", source="torchrun")),
     ("finish", "completed", 0)),
    ("...and torchrun's agent died of the TERM passed on: its own exit code 1", dict(
        status=1, caught=caught("USR2"), finish=FINISHED,
        failure=Diagnosis(0, "n1", "exited with exit code 1", None, "srun")),
     ("finish", "completed", 0)),
    # --- row runtime-requeue: the runtime's word ---------------------------------------------------------
    ("the runtime asked for a requeue on its own (exit 76)", dict(status=76),
     ("requeue", "time_limit", 0)),
    ("the runtime's requeue record, its 75 hidden by torchrun", dict(
        status=1, record=ExitRecord.parse({"cause": "preemption", "requeue": "1", "restart_count": "0"})),
     ("requeue", "preemption", 0)),
    ("the checkpoint storage was unavailable (a dead node's lock): its record",
     dict(status=1, record=ExitRecord.parse({"cause": "storage", "requeue": "1", "restart_count": "0"})),
     ("requeue", "storage", 0)),
    ("storage trouble past max_storage_retries=3", dict(
        status=1, requeues={"storage": 3},
        record=ExitRecord.parse({"cause": "storage", "requeue": "1", "restart_count": "0"})),
     ("stop", "storage", 1)),
    # --- row out-of-memory: Slurm ended the step for memory ------------------------------------------
    ("Slurm killed the step over its memory: its words, not a crash", dict(
        status=137, memory="n2: StepId=3015014.0 exceeded memory limit (214884352 > "
                           "106954752), being killed"), ("finish", "out_of_memory", 137)),
    ("...even with crash restarts to spend: the same request fails again", dict(
        status=137, memory="oom-kill event", budget=replace(
            BUDGET, per_cause={**BUDGET.per_cause, "user_crash": 2})),
     ("finish", "out_of_memory", 137)),
    ("...a preemption is still Slurm's first fact", dict(
        view=PREEMPTING, status=137, memory="oom-kill event"), ("requeue", "preemption", 0)),
    # --- row port-taken: the rendezvous port was taken at start-up ---------------------------------
    ("rank 0's store could not bind its port, still taken: another port, not a crash",
     dict(status=1, port=(27001, 27002), inplace=InPlace(max=2),
          record=ExitRecord.parse({"cause": "user_crash", "requeue": "0"})), ("restart", "port_taken", 0)),
    ("...even with max_step_restarts spent: it counts against no limit",
     dict(status=1, port=(27001, 27002), inplace=InPlace(max=2, used=2)),
     ("restart", "port_taken", 0)),
    ("...but not in an allocation that cannot take a restart: a crash's fate",
     dict(status=1, port=(27001, 27002), inplace=InPlace(max=2, left_s=10)),
     ("finish", "user_crash", 1)),
    ("...nor after the job moved its port 8 times", dict(
        status=1, port=(27008, 27009), restarts={"port_taken": 8}, inplace=InPlace(max=2)),
     ("finish", "user_crash", 1)),
    ("...and a preemption is still Slurm's first fact", dict(
        view=PREEMPTING, status=1, port=(27001, 27002)), ("requeue", "preemption", 0)),
    # --- row crash: crashes ------------------------------------------------------------------
    ("a rank raised", dict(status=1), ("finish", "user_crash", 1)),
    ("a rank raised; its crash record", dict(status=1, record=ExitRecord.parse({"cause": "user_crash",
                                                               "requeue": "0"})),
     ("finish", "user_crash", 1)),
    ("the OOM killer (SIGKILL)", dict(status=137), ("finish", "user_crash", 137)),
    ("a crash with max_crash_restarts=2", dict(status=1, budget=replace(
        BUDGET, per_cause={**BUDGET.per_cause, "user_crash": 2})), ("requeue", "user_crash", 0)),
    # --- limits -----------------------------------------------------------------------------
    ("a preemption past max_preemptions=2", dict(view=PREEMPTING, status=143,
                                                 requeues={"preemption": 2}, budget=replace(
        BUDGET, per_cause={**BUDGET.per_cause, "preemption": 2})), ("stop", "preemption", 143)),
    ("a time limit past max_requeues", dict(status=76, caught=caught("USR2"), restart_count=10),
     ("stop", "time_limit", 76)),
    ("crash restarts spent", dict(status=1, requeues={"user_crash": 2}, budget=replace(
        BUDGET, per_cause={**BUDGET.per_cause, "user_crash": 2})), ("stop", "user_crash", 1)),
]


@pytest.mark.parametrize("name, kw, expected", ROWS, ids=[r[0] for r in ROWS])
def test_the_decision_table(name: str, kw: dict, expected: tuple[str, str, int]) -> None:
    d = decide(facts(**kw))
    assert (d.action, d.cause, d.exit_code) == expected, d.why
    assert d.why


def test_a_death_at_exit_after_the_work_names_the_rank_and_the_signal() -> None:
    d = decide(facts(status=134, finish=FINISHED, failure=ABORTED))
    assert d.detail == "rank 1 then died at exit (SIGABRT)"
    assert d.why == ("all 2 ranks finished (step 5) with their saves durable; "
                     "rank 1 then died at exit (SIGABRT)")
    assert decide(facts(status=0, finish=FINISHED)).detail == ""   # a clean finish: no note
    hung = decide(facts(status=137, finish=FINISHED, hang="x", hang_phase="exited"))
    assert hung.detail == "their exit then hung and the watchdog ended it"
    stopped = decide(facts(status=1, finish=FINISHED, caught=caught("USR2")))
    assert stopped.detail == "the stop (SIGUSR2) then ended the step as they left"
    # torchrun's agent passed the stop on and a rank torn down by it died of gloo's abort
    # (CI, 1 run of ~10): both facts, the stop first
    torn = decide(facts(status=1, finish=FINISHED, caught=caught("USR1"), failure=ABORTED))
    assert torn.detail == "the stop (SIGUSR1) then ended the step as they left; " \
                          "rank 1 died of SIGABRT"


def test_one_order_for_why_a_run_ended() -> None:
    """The verdict, sacct's specific state, the stop notice, the runtime's request (but not
    its guess of a preemption against sacct's word), sacct's bare REQUEUED: for row
    slurm-requeued and for the next run's start alike."""
    from hpctrain.supervisor.decision import why_run_ended

    requeue = {"cause": "preemption", "requeue": "1"}
    assert why_run_ended(verdict=Verdict.parse({"action": "requeue", "cause": "hang"}),
                         run_state="NODE_FAIL", notice="time_limit") == "hang"
    assert why_run_ended(verdict=Verdict.parse({"action": "finish", "cause": "user_crash"}),
                         run_state="NODE_FAIL", notice="time_limit") == "node_fail"
    assert why_run_ended(run_state="REQUEUED", notice="time_limit", record=ExitRecord.parse(requeue)) \
        == "time_limit"
    # the runtime took somebody's requeue (a TERM, no notice) for a preemption: sacct's
    # bare REQUEUED says otherwise (a preemption is PREEMPTED), and Slurm is the truth
    assert why_run_ended(run_state="REQUEUED", notice="cancelled", record=ExitRecord.parse(requeue)) \
        == "requeued"
    assert why_run_ended(notice="cancelled", record=ExitRecord.parse(requeue)) == "preemption"
    assert why_run_ended(run_state="REQUEUED", status=76) == "time_limit"
    assert why_run_ended(run_state="REQUEUED") == "requeued"
    assert why_run_ended() is None


def test_finish_reads_the_ranks_last_records() -> None:
    def finish(records: dict[int, dict[str, str]], world: int = 2) -> Finish:
        return Finish.from_records(by_rank(records), world)
    records = {0: {"exit": "return", "phase": "exited", "flushed": "1", "step": "59"},
               1: {"exit": "return", "phase": "exited", "flushed": "1", "step": "59"}}
    assert finish(records).done
    assert finish(records).text() == "all 2 ranks finished (step 59) with their saves durable"
    assert not finish(records, 3).done              # rank 2 said nothing
    assert not finish({**records, 1: {**records[1], "phase": "exiting"}}).done
    assert not finish({**records, 1: {**records[1], "flushed": "0"}}).done
    assert not finish({**records, 1: {**records[1], "exit": "crash"}}).done
    assert not finish({0: {"phase": "training"}}, 1).done   # still working
    assert not finish({}, 0).done
    assert finish({**records, 1: {**records[1], "step": "58"}}).step == "58-59"


def test_a_warning_missed_in_the_hand_over_is_seen_from_slurms_end_time() -> None:
    from hpctrain.supervisor.decision import warning_due

    view = replace(RUNNING, end_time=NOW + 100)
    assert warning_due(view, 120, NOW)               # 100 s left, the warning comes at 120
    assert not warning_due(view, 60, NOW)            # not yet
    assert not warning_due(view, 0, NOW)             # no --signal
    assert not warning_due(None, 120, NOW)           # Slurm not asked
    assert not warning_due(replace(view, end_time=None), 120, NOW)  # no time limit


def test_the_warning_is_due_at_the_lead_by_slurms_end_time() -> None:
    """When a running step that has had no warning takes it as received (Slurm's may have
    come before the script listened)."""
    from hpctrain.supervisor.decision import warning_at

    view = replace(RUNNING, end_time=NOW + 100)
    assert warning_at(view, 30) == NOW + 70
    assert warning_at(view, 0) is None                 # no --signal: nothing to make up
    assert warning_at(None, 30) is None
    assert warning_at(replace(view, end_time=None), 30) is None   # no time limit


def test_a_requeue_names_the_budget_and_a_stop_the_limit() -> None:
    d = decide(facts(view=PREEMPTING, status=143, requeues={"preemption": 1}, restart_count=3))
    assert d.detail == "restart 4 of max_requeues=10, preemption requeue 2 of max_preemptions=10"
    tight = replace(BUDGET, per_cause={**BUDGET.per_cause, "preemption": 1})
    d = decide(facts(view=PREEMPTING, status=143, requeues={"preemption": 1}, budget=tight))
    assert (d.limit, d.detail) == ("max_preemptions=1",
                                   "max_preemptions=1 reached (this is preemption requeue 2)")
    d = decide(facts(status=76, caught=caught("USR2"), restart_count=10))
    assert d.detail == "max_requeues=10 reached (this is restart 11)"


def test_limits() -> None:
    assert over_limit(BUDGET, "preemption", 10, 10) is None
    assert over_limit(BUDGET, "preemption", 11, 10) == "max_preemptions=10"
    assert over_limit(BUDGET, "node_fail", 4, 5) == "max_node_failures=3"
    assert over_limit(BUDGET, "requeued", 9, 9) is None     # counts for the total only
    assert over_limit(BUDGET, "requeued", 1, 11) == "max_requeues=10"
    assert over_limit(Budget(10), "user_crash", 1, 1) == "max_crash_restarts=0"  # default 0
    assert limit_text("max_node_failures=0", "node_fail", 1, 1) == \
        "max_node_failures=0 reached (this is node_fail requeue 1)"
    assert budget_text(BUDGET, "requeued", 1, 2) == "restart 2 of max_requeues=10"


def test_slurm_events() -> None:
    assert slurm_event(None, 0) == "unknown"
    assert slurm_event(RUNNING, 0) == "running"
    assert slurm_event(PREEMPTING, 0) == "preemption"
    assert slurm_event(TIMED_OUT, 0) == "time_limit"
    assert slurm_event(CANCELLED, 0) == "ended"
    assert slurm_event(REQUEUED, 0) == "requeued"
    assert slurm_event(replace(REQUEUED, state="RUNNING"), 1) == "running"  # the next run


@pytest.mark.parametrize("signal, view, cause", [
    ("USR2", RUNNING, "time_limit"),       # the --signal=B:USR2 warning
    ("USR2", PREEMPTING, "preemption"),    # send_user_signal: the same signal, preempting
    ("TERM", PREEMPTING, "preemption"),
    ("TERM", TIMED_OUT, "time_limit"),
    ("TERM", RUNNING, None),               # scancel or a stop request: no notice
    ("TERM", None, None),
])
def test_the_stop_notice_follows_slurm(signal: str, view: JobView | None,
                                       cause: str | None) -> None:
    assert notice_cause(signal, view, "USR2") == cause


def test_requeues_nobody_counted_are_entered_at_the_next_start() -> None:
    """Restart 3 after a supervisor requeue (1) and two Slurm did alone: the newest takes
    the previous run's own word, others how sacct saw that run end, else node failure."""
    states = ["REQUEUED", "PREEMPTED", "NODE_FAIL", "RUNNING"]
    assert missing_requeues(1, 3, None, states) == [(2, "preemption"), (3, "node_fail")]
    assert missing_requeues(1, 3, "time_limit", states) == [(2, "preemption"),
                                                            (3, "time_limit")]
    assert missing_requeues(0, 1, None, []) == [(1, "node_fail")]   # no accounting
    assert missing_requeues(0, 1, None, ["REQUEUED"]) == [(1, "requeued")]  # an admin
    assert missing_requeues(2, 2, None, states) == []


# Issue 41: a job is COMPLETED only if its ranks finished their work. Each rank's last word
# (hpctrain.runtime.teardown) by how its script left, against how the step then died.
# "stopped": an attempt of hpctrain.runtime.run that failed and was told not to restart in
# its processes; its exception goes on, and its word is a crash (the false COMPLETED of
# issue 41 came from a word of "return" here).
LAST_WORDS = {
    "returned":          ({"exit": "return", "phase": "exited", "flushed": "1"}, True),
    "stopped":           ({"exit": "crash", "phase": "exited", "flushed": "1"}, False),
    "crashed":           ({"exit": "crash", "phase": "exited", "flushed": "1"}, False),
    "requeue asked":     ({"exit": "requeue", "phase": "exited", "flushed": "1"}, False),
    "save not durable":  ({"exit": "return", "phase": "exited", "flushed": "0"}, False),
    "died in the work":  ({"phase": "training"}, False),
    "no word":           ({}, False),
}
DEATHS = {   # the step's status, the first failure's signal (srun: 128 + signal)
    "aborted at exit (SIGABRT)": (134, "SIGABRT"),
    "killed by a signal (SIGTERM)": (143, "SIGTERM"),
    "exit code 1": (1, None),
}


@pytest.mark.parametrize("death", DEATHS)
@pytest.mark.parametrize("word", LAST_WORDS)
def test_a_job_is_completed_only_when_every_rank_returned_with_its_saves_durable(
        word: str, death: str) -> None:
    """Rank 1's last word x the step's death; rank 0 returned. COMPLETED only when rank 1
    returned too and the death was a signal after the work (row died-at-exit); a word that is not a
    return is a failure of the run, whatever the death looks like."""
    record, finished = LAST_WORDS[word]
    status, died_of = DEATHS[death]
    returned = {"exit": "return", "phase": "exited", "flushed": "1", "step": "19"}
    finish = Finish.from_records(by_rank({0: returned, 1: {**record, "step": "19"}}), 2)
    failure = Diagnosis(1, "n2", "signal", "", "srun", died_of) if died_of else None
    d = decide(facts(status=status, finish=finish, failure=failure))
    completed = finished and died_of is not None
    assert (d.cause == "completed") == completed, (word, death, d)
    if not completed:
        assert d.cause == "user_crash" and d.exit_code != 0, (word, death, d)


# ---- a crash under hpctrain.runtime.run: the default budget and the repeated-crash rule ------
DEFAULT = Budget(10, {"preemption": 10, "time_limit": 10, "node_fail": 3, "storage": 3})
CRASH_20 = {"cause": "user_crash", "requeue": "0", "step": "20", "rank": "1",
            "error": "RuntimeError: boom"}
ROOM = InPlace(max=2)


def test_a_runtime_run_crash_is_restarted_by_default_a_plain_scripts_is_not() -> None:
    wrapped = decide(facts(status=1, budget=DEFAULT, wrapped=True, record=ExitRecord.parse(CRASH_20),
                           inplace=ROOM))
    assert (wrapped.action, wrapped.cause) == ("restart", "user_crash"), wrapped
    plain = decide(facts(status=1, budget=DEFAULT, record=ExitRecord.parse(CRASH_20), inplace=ROOM))
    assert (plain.action, plain.cause, plain.exit_code) == ("finish", "user_crash", 1)


def test_the_default_crash_budget_is_three_recoveries_in_place_then_by_requeue() -> None:
    def after(restarts: int, requeues: int) -> str:
        return decide(facts(status=1, budget=DEFAULT, wrapped=True, record=ExitRecord.parse(CRASH_20),
                            restarts={"user_crash": restarts}, requeues={"user_crash": requeues},
                            inplace=InPlace(max=2, used=restarts))).action
    assert [after(0, 0), after(1, 0), after(2, 0), after(2, 1)] == \
        ["restart", "restart", "requeue", "stop"]
    spent = decide(facts(status=1, budget=DEFAULT, wrapped=True, record=ExitRecord.parse(CRASH_20),
                         restarts={"user_crash": 2}, requeues={"user_crash": 1}))
    assert spent.limit == "max_crash_restarts=3", spent


def test_the_same_error_at_the_same_step_twice_ends_the_job_as_not_transient() -> None:
    first = crash_signature(ExitRecord.parse(CRASH_20))
    assert first is not None and first.startswith("20:")
    d = decide(facts(status=1, budget=DEFAULT, wrapped=True, record=ExitRecord.parse(CRASH_20),
                     crashes=(first,), restarts={"user_crash": 1}, inplace=ROOM))
    assert (d.action, d.cause, d.exit_code) == ("finish", "user_crash", 1)
    assert d.why.startswith("crashed twice at step 20 with the same error: not transient")
    # another step, or another error at the same step: still transient as far as is known
    other_step = decide(facts(status=1, budget=DEFAULT, wrapped=True,
                              record=ExitRecord.parse({**CRASH_20, "step": "21"}), crashes=(first,),
                              restarts={"user_crash": 1}, inplace=ROOM))
    other_error = decide(facts(status=1, budget=DEFAULT, wrapped=True,
                               record=ExitRecord.parse({**CRASH_20, "error": "OSError: [Errno 5] EIO"}),
                               crashes=(first,), restarts={"user_crash": 1}, inplace=ROOM))
    assert other_step.action == other_error.action == "restart"
    # a number in the spec overrides the rule: the user asked for the retries
    given = decide(facts(status=1, wrapped=True, record=ExitRecord.parse(CRASH_20), crashes=(first,),
                         budget=replace(DEFAULT, per_cause={**DEFAULT.per_cause,
                                                            "user_crash": 5}),
                         restarts={"user_crash": 1}, inplace=ROOM))
    assert given.action == "restart"


def test_a_crash_signature_needs_the_runtimes_step_and_error() -> None:
    assert crash_signature(ExitRecord.parse({"cause": "user_crash", "error": "E: x"})) is None     # no step
    assert crash_signature(ExitRecord.parse({**CRASH_20, "cause": "preemption"})) is None
    assert crash_signature(ExitRecord.parse({**CRASH_20, "error": ""})) is None
    assert crash_signature(ExitRecord.parse(CRASH_20)) != crash_signature(ExitRecord.parse({**CRASH_20, "error": "E: y"}))
    # a script that never says its step: the runtime's count of it stands in
    assert crash_signature(ExitRecord.parse({**CRASH_20, "step": "", "at_step": "20"})) == crash_signature(ExitRecord.parse(CRASH_20))
    # two errors the record cut to the same 300 characters: their whole digests differ
    cut = {**CRASH_20, "error": "RuntimeError: " + "x" * 283 + "..."}
    assert crash_signature(ExitRecord.parse({**cut, "error_digest": "aa" * 8})) != \
        crash_signature(ExitRecord.parse({**cut, "error_digest": "bb" * 8}))


def test_ranks_killed_wordless_on_a_node_that_answers_are_its_fault_not_a_crash() -> None:
    """Issue 55, item 6: no exception, no crash record, the node answers a step: node_fail
    (max_node_failures), restarted in place, on a spare when there is one."""
    spare = decide(facts(status=1, faulty=("n2",), inplace=InPlace(max=2, healthy=3, needed=2)))
    assert (spare.action, spare.cause) == ("restart", "node_fail"), spare
    assert spare.detail.endswith("on a spare node") and "n2" in spare.why
    same = decide(facts(status=1, faulty=("n2",), inplace=InPlace(max=2)))
    assert (same.action, same.cause) == ("restart", "node_fail") and "spare" not in same.detail
    again = decide(facts(status=1, faulty=("n2",),
                         inplace=InPlace(max=2, unhealthy={"n2": "its ranks died again"})))
    assert (again.action, again.cause) == ("requeue", "node_fail"), again
