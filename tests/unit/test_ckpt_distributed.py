"""World size 2 under torch.distributed (gloo): parallel shard writes, one commit, resharding."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.ckpt import free_port, spawn, whole_manifest
from programs.ckpt_dist_worker import full_weight, worker

pytestmark = [pytest.mark.torch, pytest.mark.slow]



def test_world_size_2_save_then_load_with_world_size_1(tmp_path: Path) -> None:
    import torch

    from hpctrain.checkpoint import CheckpointManager

    spawn(worker, (2, str(tmp_path), free_port()), 2)
    step_dir = tmp_path / "step_000000005"
    man = whole_manifest(step_dir)
    assert man["world_size"] == 2
    sizes = {f["name"]: f["size"] for f in man["files"]}
    # both ranks wrote their half of the sharded weight, in parallel, to their own file
    assert sizes["rank00000.bin"] > 0 and sizes["rank00001.bin"] > 0
    shards = [t for t in man["tensors"] if t["path"] == ["model", "w"]]
    assert sorted((t["offsets"], t["shape"]) for t in shards) == [([0, 0], [32, 6]),
                                                                  ([32, 0], [32, 6])]
    # the replicated plain tensor is written once, not once per rank
    assert len([t for t in man["tensors"] if t["path"] == ["model", "b"]]) == 1
    # resharding: a single process without a process group loads the whole tensor
    with CheckpointManager(tmp_path) as mgr:
        state = {"model": {"w": torch.zeros(64, 6), "b": torch.zeros(6)}}
        assert mgr.load_latest(state) == 5
    assert torch.equal(state["model"]["w"], full_weight())
    assert torch.equal(state["model"]["b"], torch.arange(6.0))
    assert state["step"] == 5 and state["rank_rng"] == {"seed": 100}
