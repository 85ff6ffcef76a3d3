"""Per-rank values are kept per rank (2 and 4 ranks, DTensor and plain, sync and async).

Issue 12's report: each of 2 ranks saved its own optimizer state and RNG state as plain
tensors, and after load_latest both got another rank's values. Now a plain tensor is
written once only when every rank holding it holds the same bytes; otherwise each rank's
own copy is kept (manifest format 2), and loading it where the step has none for the rank
fails with the fix instead of handing over another rank's value.
"""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import pytest

from helpers.ckpt import free_port, run_cli, spawn, whole_manifest
from programs.ckpt_rank_worker import check_own, grown_world, own_state, save_and_load

pytestmark = [pytest.mark.torch, pytest.mark.slow]



def _manifest(root: Path) -> dict:
    return whole_manifest(root / "step_000000003")


def _ranks_at(manifest: dict, path: list) -> list:
    return sorted((t.get("rank", -1) for t in manifest["tensors"] if t["path"] == path))


@pytest.mark.parametrize("world, alongside", [(2, False), (2, True), (4, False)])
def test_each_rank_gets_its_own_values_back(tmp_path: Path, world: int,
                                            alongside: bool) -> None:
    """Both ways of fingerprinting (alongside the first writes, or after them while the
    disk flushes them), each then appending the per-rank values to a file already synced."""

    from hpctrain.checkpoint import CheckpointManager

    roots = [tmp_path / "sync", tmp_path / "async"]
    for root in roots:
        root.mkdir()
    spawn(save_and_load, (world, [str(r) for r in roots], free_port(), alongside), world)
    for root in roots:
        man = _manifest(root)
        # every save writes version 5 (per-rank values needed 2, crc32c 3, each rank's
        # record apart 5)
        assert man["format_version"] == 5
        # own values: one entry per rank; the replica and the DTensor shards: no rank
        assert _ranks_at(man, ["optim", "state", 0, "exp_avg"]) == list(range(world))
        assert _ranks_at(man, ["rng"]) == list(range(world))
        assert _ranks_at(man, ["model", "bias"]) == [-1]          # written once
        assert _ranks_at(man, ["model", "w"]) == [-1] * world     # a shard per rank
        assert all(e["own"] == [["extra", "seed"]] for e in man["extras"])
    # one process, no process group: rank 0 of the saved world, its own values
    with CheckpointManager(roots[0]) as mgr:
        state = own_state(0, 1)
        for leaf in (state["optim"]["state"][0]["exp_avg"], state["model"]["bias"]):
            leaf.zero_()
        assert mgr.load_latest(state) == 3
    check_own(state, 0)
    if world == 2:  # the world grows to 4: ranks 2 and 3 have no own values
        spawn(grown_world, (4, str(roots[1]), free_port()), 4)
    _export_round_trips(roots[0], world, tmp_path / "out")


def _expected(world: int) -> dict:
    """Whole tensors as `ckpt export` names them: shared ones once, own ones per rank."""
    import torch

    out = {"model.bias": torch.arange(8.0), "model.w": torch.arange(64.0).reshape(16, 4)}
    for rank in range(world):
        state = own_state(rank, 1)
        out[f"optim.state.0.exp_avg.rank{rank}"] = state["optim"]["state"][0]["exp_avg"]
        out[f"rng.rank{rank}"] = state["rng"]
    return out


def _export_round_trips(root: Path, world: int, out: Path) -> None:
    """Export to torch, safetensors and DCP; each loads back with its own tool, bitwise."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from hpctrain.checkpoint import read_tensors
    from hpctrain.checkpoint.export import export

    want = _expected(world)
    step = root / "step_000000003"
    assert {name for name, _ in read_tensors(step)} == set(want)
    out.mkdir()
    assert export(step, "torch", out / "all.pt") == len(want)
    assert export(step, "safetensors", out / "all.safetensors") == len(want)
    assert export(step, "dcp", out / "dcp") == len(want)
    back = {"torch": torch.load(out / "all.pt"),
            "safetensors": load_file(str(out / "all.safetensors"))}
    from_dcp = {k: torch.empty_like(v) for k, v in want.items()}
    with warnings.catch_warnings():  # "assuming ... a single process": it is, on purpose
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(from_dcp, checkpoint_id=str(out / "dcp"))
    back["dcp"] = from_dcp
    for fmt, got in back.items():
        assert set(got) == set(want), fmt
        for name, tensor in want.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), (fmt, name)


def test_replicated_state_still_writes_one_copy(tmp_path: Path) -> None:
    """A model every rank holds the same (DDP) costs no extra bytes: one copy, and no
    per-rank entries."""

    spawn(_save_replicas, (2, str(tmp_path), free_port()), 2)
    man = _manifest(tmp_path)
    assert man["format_version"] == 5
    assert len(man["tensors"]) == 1 and "rank" not in man["tensors"][0]
    assert all("own" not in e for e in man["extras"])


def _save_replicas(rank: int, world: int, root: str, port: int) -> None:
    import os

    import torch
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        with CheckpointManager(root) as mgr:
            mgr.save(3, {"w": torch.arange(1000.0), "step": 3})
    finally:
        dist.destroy_process_group()
        gc.collect()  # else the exit can abort (hpctrain/runtime/teardown.py)


def test_export_from_the_command_line_for_a_model(tmp_path: Path) -> None:
    """`ckpt export --only model` gives names a model's load_state_dict takes, and refuses
    to overwrite or to export a key that is not there."""
    import torch
    from safetensors.torch import load_file

    from hpctrain.checkpoint import CheckpointManager

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).to(torch.bfloat16)
    (tmp_path / "ckpt").mkdir()
    with CheckpointManager(tmp_path / "ckpt") as mgr:
        mgr.save(7, {"model": model.state_dict(), "step": 7})
    out = tmp_path / "model.safetensors"
    res = run_cli("ckpt", "export", str(tmp_path / "ckpt"), "--to", "safetensors",
                  "--only", "model", str(out))
    assert res.returncode == 0, res.stderr
    assert "exported 4 tensor(s) of step 7" in res.stdout
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).to(torch.bfloat16)
    fresh.load_state_dict(load_file(str(out)))  # strict: exactly the model's keys
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                 model.state_dict().values()))
    again = run_cli("ckpt", "export", str(tmp_path / "ckpt"), "--to", "torch", str(out))
    assert again.returncode == 5 and "exists: choose a new path" in again.stderr
    wrong = run_cli("ckpt", "export", str(tmp_path / "ckpt"), "--to", "torch", "--only",
                    "modle", str(tmp_path / "x.pt"))
    assert wrong.returncode == 5 and "no tensors under 'modle'" in wrong.stderr
    assert "['model']" in wrong.stderr
