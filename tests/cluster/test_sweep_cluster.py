"""``hpctrain sweep`` on the real devcluster: one throttled job array, every point its own."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from hpctrain import cli
from hpctrain.slurm import client
from hpctrain.slurm.parse import parse_sacct_parsable2
from helpers.jobs import isolate
from helpers.slurm import wait_until
from helpers.specs import write_spec

pytestmark = pytest.mark.slurm


def max_concurrent(intervals: list[tuple[datetime, datetime]]) -> int:
    """Most intervals overlapping at once (an end at t does not overlap a start at t)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda ev: (ev[0], ev[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def test_max_concurrent() -> None:
    t = [datetime(2026, 1, 1, 0, 0, s) for s in range(6)]
    assert max_concurrent([(t[0], t[2]), (t[1], t[3]), (t[2], t[4])]) == 2
    assert max_concurrent([(t[0], t[5]), (t[1], t[2]), (t[1], t[3])]) == 3


def test_sweep_of_12_points_runs_at_most_2_at_once_and_all_complete(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    spec = write_spec(root / "sw.toml", name="sweep12", checkpoint_dir=str(root / "ckpt"),
                      command=["bash", "-c", "echo point P=$P ckpt=$HPCTRAIN_CKPT_DIR; sleep 1"])
    values = ",".join(str(v) for v in range(12))
    assert cli.main(["sweep", str(spec), "--grid", f"run.env.P={values}",
                     "--max-parallel", "2", "--json"]) == 0
    sub = json.loads(capsys.readouterr().out)
    assert sub["points"] == 12 and [a["array"] for a in sub["arrays"]] == ["0-11%2"]
    sweep_id, array = sub["sweep_id"], sub["arrays"][0]["job_id"]

    def counts() -> dict[str, int]:
        assert cli.main(["status", "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)["jobs"]   # the sweep is ONE row
        return row["state_counts"]
    wait_until(lambda: counts() == {"COMPLETED": 12}, 150, "all 12 points to complete",
               interval_s=2)

    out = client.run(["sacct", "-X", "--parsable2", "-j", array, "-o", "JobID,State,Start,End"])
    recs = [r for r in parse_sacct_parsable2(out.stdout) if "_" in r["JobID"]]
    assert len(recs) == 12 and {r["State"] for r in recs} == {"COMPLETED"}
    spans = [(datetime.fromisoformat(r["Start"]), datetime.fromisoformat(r["End"])) for r in recs]
    assert max_concurrent(spans) <= 2

    # expanded: one row per point, each with its own overrides and checkpoint subdir
    assert cli.main(["status", sweep_id, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["jobs"]
    assert [r["point"] for r in rows] == [{"run.env.P": str(i)} for i in range(12)]
    for i in (0, 7, 11):
        assert cli.main(["logs", f"{array}_{i}"]) == 0
        assert f"point P={i} ckpt={root}/ckpt/point-{i:03d}" in capsys.readouterr().out
    # report: one line per point (a plain bash step: runs and causes, goodput unknown)
    assert cli.main(["report", sweep_id, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [p["job_id"] for p in rep["points"]] == [f"{array}_{i}" for i in range(12)]
    assert all(p["report"]["runs"][-1]["cause"] == "completed" for p in rep["points"]), rep
    assert rep["goodput"] is None


def test_sweep_above_the_array_limit_is_split_and_chained(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from hpctrain.jobs.submit import submit_sweep
    from hpctrain.slurm.parse import parse_kv_records
    from hpctrain.spec.model import JobSpec

    root = isolate(monkeypatch, tmp_path, shared=True)
    # held (nothing runs): this test is about how the arrays are queued
    spec = JobSpec.load(write_spec(root / "split.toml", name="split", sbatch={"hold": True}))
    sw = submit_sweep(spec, {"run.env.P": [str(i) for i in range(7)]}, max_parallel=2,
                      array_limit=3)
    try:
        assert [(a.sweep_offset, a.num_tasks, a.extra["array"]) for a in sw.arrays] == \
            [(0, 3, "0-2%2"), (3, 3, "0-2%2"), (6, 1, "0-0%1")]
        for prev, arr in zip(sw.arrays, sw.arrays[1:]):
            out = client.run(["scontrol", "show", "job", arr.job_id, "--oneliner"]).stdout
            assert f"afterany:{prev.job_id}" in parse_kv_records(out)[0]["Dependency"]
        assert cli.main(["status", sw.sweep_id, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["jobs"]
        assert [r["point"]["run.env.P"] for r in rows] == [str(i) for i in range(7)]
        assert [r["job_id"] for r in rows][3] == f"{sw.arrays[1].job_id}_0"
    finally:
        assert cli.main(["cancel", sw.sweep_id]) == 0
    assert capsys.readouterr().out.split()[1:] == [a.job_id for a in sw.arrays]


def test_a_sweep_queued_in_part_says_what_is_queued_and_records_it(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second array's sbatch fails (here: a wrapper around the real sbatch refuses
    every call after the first): the error says which points are queued under which sweep
    id, and the index has them, so `hpctrain cancel` reaches them."""
    import os
    import re

    from hpctrain.errors import SlurmError
    from hpctrain.jobs import index
    from hpctrain.jobs.submit import submit_sweep
    from hpctrain.spec.model import JobSpec

    root = isolate(monkeypatch, tmp_path, shared=True)
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    (wrapper / "sbatch").write_text(
        f'#!/bin/bash\nif [ -e {tmp_path}/once ]; then\n'
        '  echo "sbatch: error: Batch job submission failed: Invalid account" >&2; exit 1\n'
        f'fi\ntouch {tmp_path}/once\nexec /usr/bin/sbatch "$@"\n')
    (wrapper / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper}:{os.environ['PATH']}")
    spec = JobSpec.load(write_spec(root / "part.toml", name="part", sbatch={"hold": True}))
    with pytest.raises(SlurmError) as err:
        submit_sweep(spec, {"run.env.P": [str(i) for i in range(7)]}, max_parallel=2,
                     array_limit=3)
    found = re.search(r"queued in part: points 0-2 as sweep (\d+) \(1 arrays\); points 3-6 "
                      r"are not\. `hpctrain cancel \1`", str(err.value))
    assert found, str(err.value)
    sweep_id = found[1]
    try:
        assert [m.job_id for m in index.sweep_members(sweep_id)] == [sweep_id]
    finally:
        assert cli.main(["cancel", sweep_id]) == 0
