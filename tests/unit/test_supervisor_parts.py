"""The supervisor's pure parts: what it is told (config), what Slurm's answer means (view),
the state directory it claims, and how it names the first failing rank (diagnosis).

The Slurm and launcher texts below were recorded on the devcluster (Slurm 22.05, torch
2.13): `scontrol show job -o`, srun's failure report, torchrun's root-cause report."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from hpctrain import protocol
from hpctrain.errors import SupervisorError
from hpctrain.protocol.records import ExitRecord
from hpctrain.slurm.parse import parse_kv_line
from hpctrain.slurm.view import job_view, slurm_time
from hpctrain.supervisor.config import Config, parse_early
from hpctrain.supervisor.decision import Budget
from hpctrain.supervisor.diagnosis import (ABORT_AT_EXIT_FIX, diagnose, exceptions, log_segment,
                                           srun_first_failure, torchrun_root_cause)
from hpctrain.protocol.records import Identity
from hpctrain.supervisor.statedir import StateDir, foreign_reason

ENV = {"SLURM_JOB_ID": "4242", "SLURM_CLUSTER_NAME": "hpcdev", "HPCTRAIN_LAUNCHER": "torchrun",
       "HPCTRAIN_CKPT_DIR": "/shared/ckpt", "HPCTRAIN_MAX_REQUEUES": "5",
       "HPCTRAIN_MAX_PREEMPTIONS": "4", "HPCTRAIN_REQUEUE_SIGNAL": "USR2"}


# ---- config -------------------------------------------------------------------------------
def test_config_from_the_rendered_scripts_exports() -> None:
    cfg = Config.from_env(["--", "srun", "python", "t.py"], ENV)
    assert cfg.argv == ("srun", "python", "t.py") and cfg.key == "4242"
    assert (cfg.restart_count, cfg.cluster, cfg.base) == (0, "hpcdev", "/shared/ckpt")
    assert cfg.budget == Budget(5, {"preemption": 4, "time_limit": 5, "node_fail": 3,
                                    "storage": 3, "hang": 3})
    # a crash's limit left out: the default by the script's kind (hpctrain.runtime.run or not)
    assert cfg.budget.limit_of("user_crash") == ("max_crash_restarts", 0)
    assert cfg.budget.limit_of("user_crash", wrapped=True) == ("max_crash_restarts", 3)
    given = Config.from_env(["srun"], {**ENV, "HPCTRAIN_MAX_CRASH_RESTARTS": "0"})
    assert given.budget.limit_of("user_crash", wrapped=True) == ("max_crash_restarts", 0)
    # the watchdog: defaults for runtime jobs, plain scripts unwatched, 2 in-place restarts
    assert (cfg.limits.hang_s, cfg.limits.startup_s, cfg.limits.plain) == (300, 1800, False)
    assert (cfg.max_step_restarts, cfg.exclude_bad_nodes) == (2, True)
    set_ = Config.from_env(["srun"], {**ENV, "HPCTRAIN_HANG_TIMEOUT_S": "20",
                                      "HPCTRAIN_SAVE_TIMEOUT_S": "0",
                                      "HPCTRAIN_EXCLUDE_BAD_NODES": "0"})
    assert (set_.limits.hang_s, set_.limits.save_s, set_.limits.plain) == (20, None, True)
    assert not set_.exclude_bad_nodes and set_.health_check == ()
    checked = Config.from_env(["srun"], {**ENV, "HPCTRAIN_HEALTH_CHECK": '["gpu-check", "-q"]',
                                         "HPCTRAIN_HEALTH_CHECK_TIMEOUT_S": "30"})
    assert (checked.health_check, checked.health_check_timeout_s) == (("gpu-check", "-q"), 30)
    with pytest.raises(SupervisorError, match="HPCTRAIN_HEALTH_CHECK="):
        Config.from_env(["srun"], {**ENV, "HPCTRAIN_HEALTH_CHECK": "gpu-check -q"})
    array = Config.from_env(["srun"], {**ENV, "SLURM_ARRAY_JOB_ID": "4240",
                                       "SLURM_ARRAY_TASK_ID": "2", "SLURM_RESTART_COUNT": "3"})
    assert array.key == "4240_2" and array.restart_count == 3   # never the bare task id
    plain = Config.from_env(["srun"], {"SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": "/home/u"})
    assert plain.base == "/home/u" and plain.budget.max_requeues == 10


@pytest.mark.parametrize("argv, env, message", [
    (["--"], ENV, "no training step to run"),
    (["srun"], {}, "SLURM_JOB_ID is not set"),
    (["srun"], {**ENV, "HPCTRAIN_MAX_REQUEUES": "many"}, "HPCTRAIN_MAX_REQUEUES='many'"),
])
def test_config_errors_name_the_fix(argv: list[str], env: dict, message: str) -> None:
    with pytest.raises(SupervisorError, match=message):
        Config.from_env(argv, env)


@pytest.mark.parametrize("launcher, signal, step_signal", [
    ("torchrun", "USR2", "TERM"),   # torchrun's agent passes on only TERM
    ("srun", "USR2", "USR2"), ("deepspeed", "USR1", "USR1"),
    ("srun", "URG", "TERM"),        # ignored by default: a plain script would never stop
])
def test_what_the_step_gets_to_stop(launcher: str, signal: str, step_signal: str) -> None:
    env = {**ENV, "HPCTRAIN_LAUNCHER": launcher, "HPCTRAIN_REQUEUE_SIGNAL": signal}
    assert Config.from_env(["srun"], env).step_signal == step_signal


def test_signals_the_batch_shell_caught_before_the_hand_over() -> None:
    early = parse_early(" USR2@1795418146 TERM@1795418150 junk@x")
    assert [(c.name, c.at, c.early) for c in early] == [("USR2", 1795418146.0, True),
                                                        ("TERM", 1795418150.0, True)]
    assert parse_early("") == ()


# ---- Slurm's view ---------------------------------------------------------------------------
SHOW_JOB = ("JobId=16 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A "
            "Priority=4294901744 Nice=0 Account=root QOS=normal JobState=RUNNING Reason=None "
            "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 "
            "RunTime=00:00:02 TimeLimit=1-00:00:00 TimeMin=N/A SubmitTime=2026-11-23T07:33:37 "
            "EligibleTime=2026-11-23T07:33:37 StartTime=2026-11-23T07:33:37 "
            "EndTime=2026-11-24T07:33:37 Deadline=N/A PreemptEligibleTime=2026-11-23T07:33:37 "
            "PreemptTime=None SuspendTime=None Partition=debug NodeList=n2 BatchHost=n2 "
            "Command=(null) WorkDir=/work/main StdErr=/shared/job-16.out StdIn=/dev/null "
            "StdOut=/shared/job-16.out Power= ")


def test_the_view_of_a_running_job() -> None:
    view = job_view("16", parse_kv_line(SHOW_JOB))
    assert (view.state, view.reason, view.restarts, view.requeue) == ("RUNNING", "None", 0, True)
    assert view.preempt_time is None and view.end_time == slurm_time("2026-11-24T07:33:37")
    assert view.std_err == "/shared/job-16.out" and view.node_list == "n2"
    assert not view.ending and not view.time_limit_reached
    ended = job_view("16", parse_kv_line(SHOW_JOB.replace("JobState=RUNNING Reason=None",
                                                          "JobState=COMPLETING Reason=TimeLimit")))
    assert ended.ending and ended.time_limit_reached
    assert slurm_time("Unknown") is None and slurm_time("None") is None


# ---- the state directory ----------------------------------------------------------------------
def test_a_fresh_job_moves_aside_what_another_job_left(tmp_path: Path) -> None:
    """Job 5 of an earlier cluster (or before Slurm's ids reset) left a ledger full of
    requeues and a stop notice: job 5 of today, restart 0, owns none of it."""
    old = protocol.state_dir(tmp_path, "5")
    old.mkdir(parents=True)
    (old / "ledger").write_text("requeue cause=preemption restart_count=1 by=supervisor\n" * 9)
    (old / "stop").write_text("cause=preemption\nrestart_count=0\n")
    state, note = StateDir.claim(str(tmp_path), "5", 0, "hpcdev", "")
    assert "moved" in note and "restart 0" in note
    assert state.ledger().total == 0 and not state.file("stop").exists()
    aside = [p for p in old.parent.iterdir() if p.name.startswith("5.stale-")]
    assert len(aside) == 1 and (aside[0] / "ledger").exists()      # kept, not deleted
    # the next run of this job keeps what the first wrote
    state.append_ledger("requeue cause=preemption restart_count=1 by=supervisor")
    again, note = StateDir.claim(str(tmp_path), "5", 1, "hpcdev", "")
    assert note == "" and again.run_id == state.run_id and again.ledger().total == 1


@pytest.mark.parametrize("identity, restart, cluster_name, submission, foreign", [
    ({}, 0, "c", "", True),
    ({"run_id": "r", "cluster": "c"}, 0, "c", "", True),     # restart 0 owns nothing yet
    ({"run_id": "r", "cluster": "c"}, 2, "c", "", False),
    ({}, 2, "c", "", True),                                  # no identity: not ours
    ({"run_id": "r", "cluster": "other"}, 2, "c", "", True),
    ({"run_id": "r", "cluster": "c", "submission": "s1"}, 2, "c", "s2", True),
    ({"run_id": "r", "cluster": "c", "submission": "s1"}, 2, "c", "s1", False),
    ({"run_id": "r", "cluster": "c", "submission": ""}, 2, "c", "s2", False),
])
def test_whose_directory_it_is(identity: dict, restart: int, cluster_name: str,
                               submission: str, foreign: bool) -> None:
    assert bool(foreign_reason(Identity.parse(identity), restart, cluster_name,
                               submission)) == foreign


def test_records_of_another_job_or_run_are_not_read(tmp_path: Path) -> None:
    state, _ = StateDir.claim(str(tmp_path), "9", 0, "", "")
    state.write("exit", {"cause": "preemption", "requeue": 1, "restart_count": 0})
    assert state.exit_record(0).cause == "preemption"
    assert state.exit_record(1) is None                      # another run's
    protocol.write_record(state.file("exit"), {"cause": "preemption", "restart_count": 0,
                                               "run_id": "someone-else"})
    assert state.exit_record(0) is None                      # another job's
    assert oct(state.path.stat().st_mode & 0o777) == "0o700"


# ---- diagnosis -----------------------------------------------------------------------------------
TORCHRUN = """rank 1 uprank 0 up

[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/tr/crash.py", line 6, in <module>
[rank1]:     raise ValueError(f"boom on rank {r}")
[rank1]: ValueError: boom on rank 1
W1123 07:21:18.821000 7679 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 7685 closing signal SIGTERM
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
crash.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_07:21:18
  host      : n1
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7685)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 7685
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_07:21:18
  host      : n2
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 7686)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
SRUN = """Traceback (most recent call last):
  File "<string>", line 1, in <module>
KeyError: 'missing shard 7'
srun: error: n2: task 3: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=19.0
slurmstepd-n1: error: *** STEP 19.0 ON n1 CANCELLED AT 2026-11-23T07:36:10 ***
srun: error: n2: task 2: Terminated
srun: error: n1: tasks 0-1: Terminated
srun: Force Terminated StepId=19.0
"""


def test_torchruns_root_cause_names_rank_node_and_the_ranks_exception() -> None:
    assert torchrun_root_cause(TORCHRUN)["host"] == "n2"
    d = diagnose(TORCHRUN, "torchrun", None)
    assert (d.rank, d.node, d.exit_code, d.source) == (3, "n2", "exit code 1", "torchrun")
    assert d.error == "ValueError: boom on rank 1"   # rank 3 printed none: the first one
    assert d.text() == "rank 3 on n2 (exit code 1): ValueError: boom on rank 1"


def test_sruns_first_failing_task_is_the_rank() -> None:
    assert srun_first_failure(SRUN) == {"node": "n2", "tasks": "3",
                                        "what": "Exited with exit code 1"}
    d = diagnose(SRUN, "srun", None)
    assert (d.rank, d.node, d.exit_code, d.error) == (3, "n2", "exited with exit code 1",
                                                      "KeyError: 'missing shard 7'")
    assert diagnose(SRUN, "torchrun", None).rank is None   # under torchrun a task is a node


def test_the_runtimes_crash_record_comes_first_and_bare_logs_still_help() -> None:
    record = {"cause": "user_crash", "rank": "2", "node": "n2", "step": "7",
              "error": "RuntimeError: simulated"}
    d = diagnose(SRUN, "srun", ExitRecord.parse(record))
    assert (d.rank, d.node, d.error, d.source) == (2, "n2", "RuntimeError: simulated", "runtime")
    assert exceptions("x\n[rank0]: Traceback (most recent call last):\n[rank0]:   File\n"
                      "[rank0]: OSError: disk full\n") == [(0, "OSError: disk full")]
    assert diagnose("all good\n", "srun", None) is None


# torch 2.13's gloo group torn down by the interpreter's exit (issue 31), as each launcher
# reported it on this machine
ABORT_TORCHRUN = """terminate called without an active exception
W1125 12:33:43.386000 3998 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 4010 closing signal SIGTERM
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
nodestroy.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-25_12:33:43
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4010)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4010
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_12:33:43
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 4011)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 4011
======================================================
"""
ABORT_SRUN = """terminate called without an active exception
srun: error: n2: task 1: Aborted
srun: launch/slurm: _step_signal: Terminating StepId=12.0
srun: error: n2: task 0: Terminated
"""


def test_an_abort_at_exit_names_its_signal_the_likely_cause_and_the_fix() -> None:
    d = diagnose(ABORT_TORCHRUN, "torchrun", None)
    assert (d.rank, d.exit_code, d.signal) == (1, "exit code -6", "SIGABRT")
    assert d.error == ABORT_AT_EXIT_FIX and "destroy_process_group()" in d.error
    d = diagnose(ABORT_SRUN, "srun", None)
    assert (d.rank, d.node, d.signal, d.error) == (1, "n2", "SIGABRT", ABORT_AT_EXIT_FIX)
    # a death by signal without those words: the signal, no guess at the cause
    d = diagnose("srun: error: n1: task 0: Segmentation fault (core dumped)\n", "srun", None)
    assert (d.signal, d.error) == ("SIGSEGV", None)
    # an exit code is the script's own: no signal
    assert diagnose(SRUN, "srun", None).signal is None
    assert diagnose(TORCHRUN, "torchrun", None).signal is None
    # a launcher that says nothing: the words alone
    d = diagnose("terminate called without an active exception\n", "deepspeed", None)
    assert (d.signal, d.error, d.source) == ("SIGABRT", ABORT_AT_EXIT_FIX, "log")


def test_only_this_runs_part_of_the_log_is_read(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text("run 0: Traceback (most recent call last):\nOldError: x\n")
    offset = log.stat().st_size
    with open(log, "a") as fh:
        fh.write(SRUN)
    assert log_segment(str(log), offset) == SRUN
    assert log_segment(str(tmp_path / "none"), 0) == ""
    assert os.path.getsize(log) > offset


def test_slurms_own_word_that_it_ended_a_step_for_memory() -> None:
    """As the strict devcluster printed it (JobAcctGatherParams=OverMemoryKill), and as
    the cgroup OOM killer's notice reads at sites with task/cgroup."""
    from hpctrain.supervisor.diagnosis import memory_kill

    log = ("slurmstepd-n1: error: *** STEP 3015014.0 ON n1 CANCELLED AT 2026-11-26T21:31:21 ***\n"
           "slurmstepd-n2: error: StepId=3015014.0 exceeded memory limit (214884352 > "
           "106954752), being killed\n"
           "slurmstepd-n1: error: Exceeded job memory limit\n"
           "srun: error: n1: tasks 0-1: Killed\n")
    assert memory_kill(log) == ("n2: StepId=3015014.0 exceeded memory limit (214884352 > "
                                "106954752), being killed")
    cgroup = ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=7.0. Some of your "
              "processes may have been killed by the cgroup out-of-memory handler.\n")
    assert memory_kill(cgroup).startswith("Detected 1 oom-kill event(s) in StepId=7.0")
    assert memory_kill("srun: error: n1: task 0: Killed\nMemoryError\n") is None


# torchrun's report when both ranks of a node failed within one second and neither wrote an
# error file: it names the lowest rank, here the one that only lost its peer (as a loaded
# devcluster printed it for tests/programs/ddp_snapshot.py --crash-at-epoch 2)
PEER_LOST = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/w/tests/programs/ddp_snapshot.py", line 68, in main
[rank1]:     raise RuntimeError(f"bad batch in epoch {epoch}")
[rank1]: RuntimeError: bad batch in epoch 2
[rank0]: Traceback (most recent call last):
[rank0]:   File "/w/tests/programs/ddp_snapshot.py", line 74, in main
[rank0]:     loss.backward()
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29641
E1126 21:20:03.112000 4102 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 4110) of binary: /venv/bin/python
Failures:
[1]:
  time      : 2026-11-26_21:20:03
  host      : vm
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 4111)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-26_21:20:03
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4110)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
srun: error: n1: task 0: Exited with exit code 1
"""


def test_a_rank_that_only_lost_its_peer_is_not_named_for_the_crash() -> None:
    d = diagnose(PEER_LOST, "torchrun", None)
    assert (d.rank, d.node, d.error) == (1, "n1", "RuntimeError: bad batch in epoch 2")
    # a root cause that printed its own error, or none at all, stays torchrun's word
    assert diagnose(TORCHRUN, "torchrun", None).rank == 3
    own = PEER_LOST.replace("Connection closed by peer", "CUDA error: an illegal memory access")
    assert diagnose(own, "torchrun", None).rank == 0


# ---- the step loop's states: its docstring, docs/architecture.md and its handlers agree ---------
def _states_in_docstring() -> list[tuple[str, str, str]]:
    from hpctrain.supervisor.steploop import StepLoop
    doc = StepLoop.watch.__doc__ or ""
    rows = []
    for line in doc.splitlines():
        words = line.strip()
        if not words or words.startswith("=") or words.startswith("state "):
            continue
        parts = [p for p in re.split(r"\s{2,}", words) if p]
        if len(parts) == 3 and parts[0].isalpha() and parts[0].islower():
            rows.append((parts[0], parts[1], parts[2]))
    return rows


def test_the_step_loops_states_are_its_handlers_and_the_architecture_docs_table() -> None:
    from hpctrain.supervisor.steploop import StepLoop
    code = _states_in_docstring()
    assert [r[0] for r in code] == ["running", "settling", "naming", "arriving", "leaving",
                                    "killing"], code
    assert all(callable(getattr(StepLoop, f"_{state}", None)) for state, _, _ in code)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    table = doc.split("## The step loop's states", 1)[1].split("\n## ", 1)[0]
    rows = [tuple(c.strip() for c in line.strip().strip("|").split("|"))
            for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == code, (rows, code)      # (the first row is the header)


# RunState's fields and the only supervisor modules that write them (each field's comment
# in runstate.py names its writer); a behaviour's state written in one place: a lost node's
# fields by nodeloss.py alone (issue 58's walk: five writers before)
WRITERS = {"caught": {"run.py"}, "pending": {"run.py"}, "requeues": {"run.py"},
           "hang": {"steploop.py"}, "on": {"spares.py"}, "lost": {"nodeloss.py"},
           "unanswered": {"nodeloss.py"}, "faulty": {"nodeloss.py"},
           "retried": {"nodeloss.py"}, "slow": {"nodeloss.py"}, "step": {"steploop.py"},
           "given_back": {"nodeloss.py"},
           "forwarded": {"run.py", "steploop.py"}, "acted": {"run.py"}, "warn_at": {"run.py"},
           "bad": set(), "clock": set()}     # bad: through BadNodes.found; clock: at start
MUTATORS = {"append", "extend", "update", "add", "clear", "pop", "remove", "setdefault",
            "insert", "discard"}


def _run_fields_written(tree: ast.AST) -> set[str]:
    """The RunState fields a module assigns or mutates (as ``run.X``, ``self.run.X`` or
    ``self.run_state.X``)."""
    def of_run(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "run") or (
            isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "self" and node.attr in ("run", "run_state"))
    found = set()
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in MUTATORS:
            targets = [node.func.value]
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                t = t.value if isinstance(t, ast.Subscript) else t
                if isinstance(t, ast.Attribute) and of_run(t.value):
                    found.add(t.attr)
    return found


def test_each_field_of_the_run_state_is_written_only_by_its_named_writers() -> None:
    from hpctrain.supervisor.runstate import RunState
    assert set(WRITERS) == set(RunState.__dataclass_fields__), "a new field: name its writer"
    root = Path(__file__).resolve().parents[2] / "hpctrain" / "supervisor"
    writers: dict[str, set[str]] = {name: set() for name in WRITERS}
    for module in root.rglob("*.py"):
        if module.name == "runstate.py":
            continue
        for name in _run_fields_written(ast.parse(module.read_text())):
            writers.setdefault(name, set()).add(module.name)
    assert writers == WRITERS, writers


def test_srun_and_hpctrain_lines_inside_a_traceback_are_not_its_exception() -> None:
    """The job log interleaves every process's output: srun's word on a killed torchrun
    agent landing between a survivor's "Traceback" and its error is not the error (it was
    taken for the ranks' own, and a lost node for a crash: devcluster, torchrun, 2026-11-29)."""
    log = ("Traceback (most recent call last):\n"
           "srun: error: n2: task 1: Killed\n"
           "hpctrain: rank 3: attempt 0 ended (peer: ...)\n"
           '  File "x.py", line 3, in main\n'
           "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:29316\n"
           "srun: error: n1: task 0: Exited with exit code 1\n")
    assert exceptions(log) == [(None, "RuntimeError: [pair.cc:553] Connection closed by "
                                      "peer [127.0.0.1]:29316")]
    d = diagnose(log, "torchrun", None)
    assert d is not None and d.error is not None and d.error.startswith("RuntimeError")
