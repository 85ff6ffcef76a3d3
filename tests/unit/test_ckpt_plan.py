"""The save plan made once (issue 42), with real processes and gloo: a later save of the
same structures makes no planning gather, only an all-reduce of three numbers and the
fingerprint exchange; a structure that changes on one rank plans again on every rank; a
coordinator that fails or dies mid-plan fails the save on every rank and commits nothing;
every step loads back bitwise at 1, 2 and 4 ranks; a rank reads its own record of the
manifest; a checkpoint of the previous format (0.7, format 4) still loads on its ranks.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from helpers.ckpt import free_port, run_cli, spawn, whole_manifest
from programs.ckpt_plan_worker import (coordinator_fails, coordinator_killed, damaged_record,
                                       old_format, plan_reuse, round_trip)

pytestmark = [pytest.mark.torch, pytest.mark.slow]

OLD = Path(__file__).resolve().parents[1] / "data" / "ckpt-0.7"   # 2 ranks, hpctrain 0.7.0


def _spawn(fn, world: int, *args) -> None:
    spawn(fn, (world, *args), world)


def _ranks_at(step_dir: Path, path: list) -> list:
    return sorted(t.get("rank", -1) for t in whole_manifest(step_dir)["tensors"]
                  if t["path"] == path)


def test_the_plan_is_made_once_and_made_again_when_a_structure_changes(tmp_path: Path) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    root.mkdir()
    out.mkdir()
    _spawn(plan_reuse, 3, str(root), free_port(), str(out))
    costs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]
    for rank, saves in enumerate(costs):
        first, later, changed, again = saves
        # planned at the first save and when rank 1's structure changed; reused otherwise
        assert [s["plans"] for s in saves] == [1, 1, 2, 2]
        assert [s["hits"] for s in saves] == [0, 1, 1, 2]
        # every save: the vote; the fingerprints to rank 0 and each rank's answer back; the
        # commit's gather of the records (its size agreed in an all-reduce). Planned: a
        # gather of the structures (its size agreed too) and a scatter of the parts more
        for made in (first, changed):
            assert (made["calls"]["all_reduce_max"], made["calls"]["gather_bytes"],
                    made["calls"]["scatter_bytes"]) == (3, 3, 2), made
        for kept in (later, again):
            assert (kept["calls"]["all_reduce_max"], kept["calls"]["gather_bytes"],
                    kept["calls"]["scatter_bytes"]) == (2, 2, 1), kept
            assert "all_gather" not in kept["calls"]      # nobody gets everybody's list
            if rank:   # a few dozen bytes, whatever the world: the vote, the answer
                assert sum(kept["received"].values()) < 200, kept["received"]
    # the values were compared at every save: "b" was shared, then each rank's own
    assert _ranks_at(root / "step_000000001", ["model", "b"]) == [-1]
    assert _ranks_at(root / "step_000000002", ["model", "b"]) == [0, 1, 2]
    assert _ranks_at(root / "step_000000003", ["model", "b"]) == [-1]
    for step in (1, 2, 3, 4):
        assert _ranks_at(root / f"step_{step:09d}", ["rng"]) == [0, 1, 2]
        assert _ranks_at(root / f"step_{step:09d}", ["model", "w"]) == [-1]
    assert _ranks_at(root / "step_000000004", ["only1"]) == [-1]   # rank 1's alone, once
    # a damaged record is found by the rank that reads it, and every rank loads step 3
    _damage_last_record(root / "step_000000004")
    _spawn(damaged_record, 3, str(root), free_port())


def _damage_last_record(step_dir: Path) -> None:
    ranks = step_dir / "manifest.ranks"
    data = bytearray(ranks.read_bytes())
    data[-3] ^= 0x01
    ranks.write_bytes(bytes(data))


def test_a_coordinator_that_fails_mid_plan_fails_the_save_on_every_rank(tmp_path: Path) -> None:
    _spawn(coordinator_fails, 3, str(tmp_path), free_port())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == [
        "step_000000001", "step_000000002", "step_000000011", "step_000000012"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_coordinator_killed_mid_plan_fails_the_others_at_once(tmp_path: Path) -> None:
    import torch

    from hpctrain.checkpoint import CheckpointManager
    from programs.ckpt_plan_worker import blank, mixed_state, same

    root, out = tmp_path / "ckpt", tmp_path / "out"
    root.mkdir()
    out.mkdir()
    ctx = spawn(coordinator_killed, (3, str(root), free_port(), str(out)), 3, join=False)
    deadline = time.monotonic() + 120
    for proc in ctx.processes:
        proc.join(max(1.0, deadline - time.monotonic()))
    assert [p.exitcode for p in ctx.processes] == [-9, 0, 0]
    for rank in (1, 2):
        got = json.loads((out / f"rank{rank}.json").read_text())
        assert "the save failed while making the save plan" in got["error"], got
        assert "nothing of this step was committed" in got["error"]
        assert got["seconds"] < 60, got   # the backend's error, not the group's 30 minutes
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == \
        ["step_000000001"]
    # what was committed loads (here: one process, rank 0's own values, the shards whole
    # into plain tensors the state holds for them)
    want = mixed_state(0, 1, 1)
    full = torch.arange(48.0).reshape(12, 4) + 1
    want["model"].update(rows=full, cols=full.double())
    back = blank(want)
    with CheckpointManager(root) as mgr:
        assert mgr.load_latest(back) == 1
    same(back, want)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_step_round_trips_bitwise(tmp_path: Path, world: int) -> None:
    if world == 1:
        round_trip(0, 1, str(tmp_path), 0)
    else:
        _spawn(round_trip, world, str(tmp_path), free_port())
    man = whole_manifest(tmp_path / "step_000000002")
    assert man["format_version"] == 5 and man["world_size"] == world
    assert sorted(t.get("rank", -1) for t in man["tensors"] if t["path"] == ["rng"]) == \
        ([-1] if world == 1 else list(range(world)))
    assert run_cli("ckpt", "verify", str(tmp_path)).returncode == 0


def test_a_checkpoint_written_by_0_7_loads_on_each_of_its_ranks(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(OLD, root)
    step = root / "step_000000003"
    assert json.loads((step / "manifest.json").read_text())["format_version"] == 4
    assert not (step / "manifest.ranks").exists()
    _spawn(old_format, 2, str(root), free_port())
    assert whole_manifest(root / "step_000000004")["format_version"] == 5
    # the command line reads both, without torch
    listed = run_cli("ckpt", "list", str(root), "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(s["step"], s["world_size"], s["valid"]) for s in json.loads(listed.stdout)] == [
        (3, 2, True), (4, 2, True)]
    verified = run_cli("ckpt", "verify", str(root))
    assert verified.returncode == 0 and "2 checkpoint(s) verified" in verified.stdout
