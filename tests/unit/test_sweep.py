"""Sweep planning (pure): grid parsing, points, array splitting, per-point specs and scripts."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, strategies as st

from hpctrain.errors import SpecError
from hpctrain.spec.model import JobSpec
from hpctrain.jobs.sweep import (dispatcher_script, differing_directives, grid_points, parse_grid,
                            plan_arrays, task_checkpoint_dir)

SPEC = {"name": "sw", "partition": "debug", "nodes": 1, "gpus_per_node": 1, "time": "00:05:00",
        "run": {"launcher": "srun", "command": ["python", "train.py"]},
        "checkpoint": {"dir": "/shared/ckpt/sw"}}


def test_grid_points_are_the_cartesian_product_first_key_slowest() -> None:
    grid = parse_grid(["run.env.LR=1e-3,3e-4", "checkpoint.keep_last=1,2,3"])
    points = grid_points(grid)
    assert len(points) == 6
    assert points[0] == {"run.env.LR": "1e-3", "checkpoint.keep_last": "1"}
    assert points[3] == {"run.env.LR": "3e-4", "checkpoint.keep_last": "1"}


@pytest.mark.parametrize("bad,fragment", [
    (["lr"], "key=v1,v2"), (["lr=1,,2"], "empty value"), (["lr=1,1"], "repeated"),
    (["lr=1", "lr=2"], "given twice"), (["checkpoint.dir=/a,/b"], "own subdirectory"), ([], "at least one"),
])
def test_bad_grids_are_refused_with_the_fix(bad: list[str], fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        parse_grid(bad)


def test_one_array_with_throttle() -> None:
    (chunk,) = plan_arrays(12, 2, 1001)
    assert chunk.array_option == "0-11%2" and chunk.after is None


def test_split_arrays_are_chained_only_when_throttled() -> None:
    chunks = plan_arrays(2500, 4, 1001)
    assert [(c.offset, c.size) for c in chunks] == [(0, 1001), (1001, 1001), (2002, 498)]
    assert [c.after for c in chunks] == [None, 0, 1]
    assert chunks[2].array_option == "0-497%4" and chunks[2].point_index(5) == 2007
    assert [c.after for c in plan_arrays(2500, None, 1001)] == [None, None, None]


@given(n=st.integers(1, 5000), k=st.one_of(st.none(), st.integers(1, 50)),
       limit=st.integers(1, 2000))
def test_chunks_cover_every_point_once_within_the_limit(n: int, k: int | None, limit: int) -> None:
    chunks = plan_arrays(n, k, limit)
    covered = [c.point_index(t) for c in chunks for t in range(c.size)]
    assert covered == list(range(n))
    assert all(c.size <= limit for c in chunks)


def test_bad_array_plans() -> None:
    with pytest.raises(SpecError, match="max-parallel 0"):
        plan_arrays(3, 0, 10)


def test_each_point_gets_its_overrides_and_own_checkpoint_dir() -> None:
    from hpctrain.jobs.submit import sweep_specs

    spec = JobSpec.from_dict(SPEC)
    points, specs = sweep_specs(spec, {"checkpoint.keep_last": ["1", "2"], "run.env.LR": ["a", "b"]})
    assert [s.checkpoint.keep_last for s in specs] == [1, 1, 2, 2]   # typed like --set
    assert [s.run.env["LR"] for s in specs] == ["a", "b", "a", "b"]
    assert [s.checkpoint.dir for s in specs] == [task_checkpoint_dir("/shared/ckpt/sw", i, 3)
                                                 for i in range(4)]
    assert specs[2].checkpoint.dir == "/shared/ckpt/sw/point-002"


def test_grid_that_changes_resources_is_found() -> None:
    a = ["#!/bin/bash", "#SBATCH --nodes=1", "#SBATCH --time=1"]
    b = ["#!/bin/bash", "#SBATCH --nodes=2", "#SBATCH --time=1"]
    assert differing_directives([a, a]) == []
    assert differing_directives([a, b]) == ["#SBATCH --nodes=1", "#SBATCH --nodes=2"]


def test_dispatcher_keeps_the_directives_and_runs_the_task_point(tmp_path) -> None:
    header = ["#!/bin/bash", "# Rendered by hpctrain", "#SBATCH --job-name=sw", "#SBATCH --requeue"]
    for i in range(12, 15):
        (tmp_path / f"point-{i}.sh").write_text(f"echo point {i}\n")
    text = dispatcher_script(header, str(tmp_path), 12)
    assert "#SBATCH --job-name=sw\n#SBATCH --requeue\n" in text
    out = subprocess.run(["bash", "-c", text], env={"SLURM_ARRAY_TASK_ID": "2", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert out == "point 14\n"


def test_sweep_dry_run_lists_points_and_refuses_resource_keys(
        tmp_path, monkeypatch, capsys) -> None:
    from hpctrain import cli
    from helpers.jobs import isolate
    from helpers.specs import write_spec

    isolate(monkeypatch, tmp_path)
    spec = write_spec(tmp_path / "s.toml", checkpoint_dir="/shared/ck")
    assert cli.main(["sweep", str(spec), "--grid", "run.env.LR=1,2,3", "--max-parallel", "2",
                     "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 points, one job array --array=0-2%2" in out
    assert "run.env.LR=3  checkpoint=/shared/ck/point-002" in out
    assert cli.main(["sweep", str(spec), "--grid", "time=00:01:00,00:02:00", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "#SBATCH --time=00:01:00" in err and "same allocation" in err

