"""The Python API: rank environment, names, records, log helpers. (submitit's requeue
protocol on the cluster: tests/cluster/test_submit_cluster.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.jobs import index
from hpctrain.jobs.submit import function_job_name
from hpctrain.runtime.function import set_rank_environment
from hpctrain.jobs.handle import expand_pattern, filter_rank, log_paths
from hpctrain.jobs.index import JobEntry
from helpers.jobs import isolate


def test_public_names_are_lazy_and_point_at_the_api() -> None:
    import hpctrain.api

    assert hpctrain.submit is hpctrain.api.submit
    assert hpctrain.Job is hpctrain.jobs.handle.Job
    assert hpctrain.Layout(tp=2).tp == 2 and hpctrain.Layout().pp == 1


def test_rank_environment_from_slurm_variables() -> None:
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_JOB_NODELIST": "gpu[07-10]", "SLURM_JOB_ID": "12345"}
    set_rank_environment(env, {"tp": 2, "pp": 2})
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["NODE_RANK"]) == ("5", "8", "1", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("gpu07", "25345")  # protocol.master_port: the template's rule
    # rank 5 with tp=2, dp=2, pp=2: tp fastest, then dp, then pp -> (pp 1, dp 0, tp 1)
    assert (env["HPCTRAIN_PP_RANK"], env["HPCTRAIN_DP_RANK"], env["HPCTRAIN_TP_RANK"]) == ("1", "0", "1")
    assert env["HPCTRAIN_DP"] == "2"
    kept = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_ADDR": "n9", "MASTER_PORT": "1"}
    set_rank_environment(kept, {})
    assert (kept["MASTER_ADDR"], kept["MASTER_PORT"]) == ("n9", "1")   # the script's values win


def test_function_job_names_are_slurm_safe() -> None:
    assert function_job_name(lambda: 0) == "lambda-"
    assert function_job_name(test_rank_environment_from_slurm_variables) == \
        "test_rank_environment_from_slurm_variables"

    def _private() -> None: ...
    assert function_job_name(_private) == "private"


def test_records_append_find_and_survive_a_damaged_line(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    isolate(monkeypatch, tmp_path)
    index.append([JobEntry("10", "a", "script", "/f"),
                    JobEntry("11", "s", "sweep", "/f", sweep_id="11", num_tasks=3),
                    JobEntry("12", "s", "sweep", "/f", sweep_id="11", sweep_offset=3)])
    with open(index.index_path(), "a") as fh:
        fh.write('{"job_id": "13", "na\n')
    index.append([JobEntry("14", "b", "function", "/f")])
    assert [r.job_id for r in index.load()] == ["10", "11", "12", "14"]
    assert index.find("11_2").job_id == "11" and index.find("14").kind == "function"
    assert [r.job_id for r in index.sweep_members("11")] == ["11", "12"]
    assert index.find("99") is None
    # the cluster's ids started again (reinstalled): id 11 is now another sweep, whose
    # members are the new ones only, as `find` gives the newest entry
    index.append([JobEntry("11", "t", "sweep", "/g", sweep_id="11", num_tasks=2),
                  JobEntry("13", "t", "sweep", "/g", sweep_id="11", sweep_offset=2)])
    assert [(r.job_id, r.name) for r in index.sweep_members("11")] == [("11", "t"), ("13", "t")]
    assert index.find("11").name == "t"


def test_log_paths_and_patterns(tmp_path: Path) -> None:
    script = "#!/bin/bash\n#SBATCH --output=logs/%x-%j.out\n#SBATCH --chdir=/w\nset -u\n"
    assert log_paths(script, tmp_path).log == "/w/logs/%x-%j.out"
    assert log_paths("#!/bin/bash\n", "/cwd").log == "/cwd/slurm-%j.out"
    assert expand_pattern("/w/%x-%j.out", "42", name="t") == "/w/t-42.out"
    assert expand_pattern("/w/%A_%a-%j-%t%%", "42_3", task=1, raw_id="45") == "/w/42_3-45-1%"
    shared = "0: a\n1: b\n0: c\nplain\n"
    assert filter_rank(shared, 0) == "0: a\n0: c\nplain\n"
    assert filter_rank("no labels\n", 1) == "no labels\n"


def test_logs_of_an_entry_without_a_log_path_is_a_clear_error(tmp_path: Path) -> None:
    """An index entry with no log path (written by hand or another tool): an error naming
    the job and where to look, not an IsADirectoryError on the working directory."""
    from hpctrain.errors import JobError
    from hpctrain.jobs.handle import Job
    job = Job(JobEntry("77", "a", "script", str(tmp_path)))
    with pytest.raises(JobError, match="job 77: the job index has no log path"):
        job.logs()
