"""Pure parts of hpctrain.runtime: environment parsing, causes, exit records."""

from __future__ import annotations

import signal

import pytest

from hpctrain.errors import LayoutError, SpecError
from hpctrain.runtime import CAUSES, REQUEUE_EXIT_CODES, Environment, cause_of_exit_code
from hpctrain.runtime.causes import cause_of_signal, cause_of_stop
from hpctrain.protocol import format_record, parse_record, read_record, write_record
from hpctrain.protocol.records import ExitRecord, StopNotice
from hpctrain.runtime.environment import rank_to_coords
from hpctrain.runtime.exitrecord import inferred_last_cause

SRUN = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "5", "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_JOB_NUM_NODES": "4",
        "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "gpu[07-10]"}


def test_srun_launch() -> None:
    env = Environment.from_env(SRUN)
    assert (env.rank, env.world_size, env.local_rank, env.node_rank) == (5, 8, 1, 2)
    assert (env.num_nodes, env.local_world_size) == (4, 2)
    assert env.job_id == env.slurm_job_id == "4242"
    assert env.master_addr == "gpu07"
    assert env.master_port == 25000 + 4242 % 4000
    assert (env.tp, env.dp, env.pp) == (1, 8, 1)
    assert env.restart_count == 0 and env.last_exit_cause is None


def test_torchrun_variables_win_over_slurm() -> None:
    # srun launches one torchrun per node: SLURM_PROCID numbers launchers, RANK the workers
    env = Environment.from_env({**SRUN, "SLURM_PROCID": "1", "SLURM_NTASKS": "4",
                                "RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "0",
                                "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "3",
                                "MASTER_ADDR": "gpu09", "MASTER_PORT": "29500"})
    assert (env.rank, env.world_size, env.local_rank, env.node_rank) == (6, 8, 0, 3)
    assert (env.master_addr, env.master_port) == ("gpu09", 29500)


def test_array_task_job_id_and_restart_count() -> None:
    env = Environment.from_env({**SRUN, "SLURM_JOB_ID": "4250", "SLURM_ARRAY_JOB_ID": "4242",
                                "SLURM_ARRAY_TASK_ID": "8", "SLURM_RESTART_COUNT": "3"})
    assert env.job_id == "4242_8"  # not 4250 (invisible) nor 4242 (shared by all tasks)
    assert env.slurm_job_id == "4250"
    assert env.restart_count == 3


def test_no_environment_is_a_single_process() -> None:
    env = Environment.from_env({})
    assert (env.rank, env.world_size, env.tp, env.dp, env.pp) == (0, 1, 1, 1, 1)
    assert env.job_id is None and not env.in_slurm and env.master_addr == "127.0.0.1"


def test_layout_from_env() -> None:
    env = Environment.from_env({**SRUN, "HPCTRAIN_TP": "2", "HPCTRAIN_PP": "2"})
    assert (env.tp, env.dp, env.pp) == (2, 2, 2)
    assert env.coords == (1, 0, 1)  # rank 5 = pp 1, dp 0, tp 1
    env = Environment.from_env({**SRUN, "HPCTRAIN_TP": "4", "HPCTRAIN_DP": "2"})
    assert (env.tp, env.dp, env.pp) == (4, 2, 1)


@pytest.mark.parametrize("layout", [{"HPCTRAIN_TP": "3"},
                                    {"HPCTRAIN_TP": "2", "HPCTRAIN_DP": "2"},
                                    {"HPCTRAIN_PP": "0"}])
def test_layout_not_matching_world_names_values_and_fix(layout: dict) -> None:
    with pytest.raises(LayoutError, match="HPCTRAIN_"):
        Environment.from_env({**SRUN, **layout})


@pytest.mark.parametrize(("name", "value"), [("RANK", "one"), ("SLURM_RESTART_COUNT", "x"),
                                             ("SLURM_JOB_END_TIME", "soon")])
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(SpecError, match=f"{name}='{value}'"):
        Environment.from_env({**SRUN, name: value})


def test_rank_outside_world() -> None:
    with pytest.raises(SpecError, match="rank 9 is outside world size 8"):
        Environment.from_env({**SRUN, "SLURM_PROCID": "9"})


def test_causes_table() -> None:
    assert REQUEUE_EXIT_CODES == (75, 76)
    assert cause_of_exit_code(75).name == "preemption"
    assert cause_of_exit_code(76).name == "time_limit"
    assert cause_of_exit_code(0).name == "completed"
    for code in (1, 2, 137, -9):
        assert cause_of_exit_code(code).name == "user_crash"
        assert not cause_of_exit_code(code).requeue
    assert CAUSES["node_fail"].requeue and CAUSES["node_fail"].exit_code is None
    assert len({c.code for c in CAUSES.values()}) == len(CAUSES)  # MAX picks one cause


def test_cause_of_signal() -> None:
    assert cause_of_signal(signal.SIGTERM).name == "preemption"
    assert cause_of_signal(signal.SIGUSR2).name == "time_limit"
    # USR2 near the end of the job: the time-limit warning
    assert cause_of_signal(signal.SIGUSR2, now=1000, end_time=1090, lead_s=90).name == "time_limit"
    # USR2 with hours left: send_user_signal preemption
    assert cause_of_signal(signal.SIGUSR2, now=1000, end_time=9000, lead_s=90).name == "preemption"
    # TERM near the end: the supervisor forwarded the time-limit USR2 to torchrun as TERM
    assert cause_of_signal(signal.SIGTERM, now=1000, end_time=1090, lead_s=90).name == "time_limit"
    assert cause_of_signal(signal.SIGTERM, now=1000, end_time=9000, lead_s=90).name == "preemption"


def test_exit_record_round_trip(tmp_path) -> None:
    fields = {"cause": "preemption", "exit_code": 75, "step": 120, "restart_count": 0}
    assert parse_record(format_record(fields)) == {k: str(v) for k, v in fields.items()}
    path = tmp_path / "sub" / "exit"
    write_record(path, fields)
    assert read_record(path)["step"] == "120"
    assert [p.name for p in path.parent.iterdir()] == ["exit"]  # no temp file left
    assert read_record(tmp_path / "missing") == {} and read_record(None) == {}
    with pytest.raises(ValueError, match="one line"):
        format_record({"cause": "a\nb"})


def test_the_supervisors_stop_notice_beats_the_time_left() -> None:
    """Far from the end, a TERM is a preemption by the clock; the notice for this run
    (restart 1) says time limit and wins. A notice of an earlier run or of another job
    (run_id), or a cause the notice may not give, leaves the clock to decide."""
    far = dict(now=1000, end_time=9000, lead_s=90)
    notice = {"cause": "time_limit", "restart_count": "1", "run_id": "r1"}
    assert cause_of_stop(signal.SIGTERM, StopNotice.parse(notice), 1, **far).name == "time_limit"
    assert cause_of_stop(signal.SIGTERM, StopNotice.parse(notice), 1, run_id="r1", **far).name == "time_limit"
    assert cause_of_stop(signal.SIGTERM, StopNotice.parse(notice), 1, run_id="r2", **far).name == "preemption"
    assert cause_of_stop(signal.SIGTERM, StopNotice.parse(notice), 2, **far).name == "preemption"
    assert cause_of_stop(signal.SIGTERM, StopNotice.parse({}), 1, **far).name == "preemption"
    bad = {"cause": "user_crash", "restart_count": "1"}
    assert cause_of_stop(signal.SIGUSR2, StopNotice.parse(bad), 1).name == "time_limit"
    near = dict(now=1000, end_time=1090, lead_s=90)
    assert cause_of_stop(signal.SIGUSR2, StopNotice.parse({"cause": "preemption", "restart_count": "0"}), 0,
                         **near).name == "preemption"


def test_previous_cause() -> None:
    record = {"cause": "time_limit", "restart_count": "1"}
    assert inferred_last_cause(ExitRecord.parse(record), 0) is None  # first run
    assert inferred_last_cause(ExitRecord.parse(record), 2) == "time_limit"
    # the record is from an older run: the last one left without writing (node failure)
    assert inferred_last_cause(ExitRecord.parse(record), 3) == "node_fail"
    assert inferred_last_cause(ExitRecord.parse({}), 1) == "node_fail"


def test_what_the_supervisor_exports_reaches_the_environment() -> None:
    env = Environment.from_env({**SRUN, "HPCTRAIN_LAST_EXIT_CAUSE": "preemption",
                                "HPCTRAIN_RUN_ID": "r1", "SLURMD_NODENAME": "gpu08",
                                "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "2"})
    assert env.last_exit_cause == "preemption" and env.run_id == "r1" and env.node == "gpu08"
    assert env.job_id == "4240_2" and env.slurm_job_id == "4242"   # the key, and Slurm's id


def test_runtime_and_planner_share_one_rank_numbering() -> None:
    """One function numbers ranks for the planner and inside the job (hpctrain.mesh,
    which imports nothing from submission code); tests/unit/test_layout.py checks its order."""
    from hpctrain import mesh
    from hpctrain.spec import layout

    assert rank_to_coords is mesh.rank_to_coords is layout.rank_to_coords
    assert Environment.from_env(SRUN).coords == (0, 5, 0)  # tp=1 dp=8 pp=1
