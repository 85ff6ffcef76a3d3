"""In-memory snapshots (hpctrain.checkpoint.snapshot): a manager made again in the same
process (the next attempt of hpctrain.runtime.run's main) restores the newest state from
memory when it is as new as storage's, without reading storage; else storage, as always.
Two ranks: tests/unit/test_runtime_restart.py."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _fresh() -> None:
    from hpctrain.checkpoint import snapshot

    snapshot._KEPT.clear()


def state(value: float, n: int = 1000) -> dict:
    import torch

    return {"model": {"w": torch.full((n,), value), "b": torch.arange(4.0) + value},
            "step": int(value), "rng": {"seed": 7}}


def break_storage(root: Path) -> None:
    """Every shard file of every step zeroed: a load from storage would fail its checks."""
    for f in root.glob("step_*/*.bin"):
        f.write_bytes(b"\0" * f.stat().st_size)


def test_an_async_saves_staged_copy_is_restored_without_reading_storage(tmp_path: Path) -> None:
    import torch

    from hpctrain.checkpoint import CheckpointManager

    with CheckpointManager(tmp_path, async_save=True) as mgr:
        mgr.save(3, state(3.0))
    break_storage(tmp_path)
    got = state(0.0)
    with CheckpointManager(tmp_path) as again:       # the next attempt's manager
        assert again.load_latest(got) == 3
    assert torch.equal(got["model"]["w"], torch.full((1000,), 3.0)) and got["step"] == 3
    assert got["rng"] == {"seed": 7}


def test_a_snapshot_newer_than_storage_wins_an_older_one_does_not(tmp_path: Path) -> None:
    import torch

    from hpctrain.checkpoint import CheckpointManager

    with CheckpointManager(tmp_path) as mgr:
        mgr.save(3, state(3.0))                        # durable, sync: no snapshot
        mgr.snapshot(5, state(5.0))                    # memory only
        assert mgr.latest_step() == 3 and not (tmp_path / "step_000000005").exists()
    got = state(0.0)
    with CheckpointManager(tmp_path) as again:
        assert again.load_latest(got) == 5
        assert torch.equal(got["model"]["b"], torch.arange(4.0) + 5.0)
        again.save(6, state(6.0))                      # storage is newer now
    got = state(0.0)
    with CheckpointManager(tmp_path) as third:
        assert third.load_latest(got) == 6 and got["step"] == 6


def test_a_state_laid_out_otherwise_is_loaded_from_storage(tmp_path: Path) -> None:
    import torch

    from hpctrain.checkpoint import CheckpointManager

    with CheckpointManager(tmp_path) as mgr:
        mgr.save(3, state(3.0))
        mgr.snapshot(3, state(3.0, n=10))              # another shape: not this state's
    got = state(0.0)
    with CheckpointManager(tmp_path) as again:
        assert again.load_latest(got) == 3
    assert torch.equal(got["model"]["w"], torch.full((1000,), 3.0))


def test_a_copy_cut_short_is_never_restored(tmp_path: Path) -> None:
    """An exception while the state is copied (a tensor that cannot be: on the meta
    device) has overwritten part of the buffers the last snapshot lives in: no snapshot is
    left to restore, and storage is read."""
    import torch

    from hpctrain.checkpoint import CheckpointManager

    with CheckpointManager(tmp_path) as mgr:
        mgr.save(3, state(3.0))
        mgr.snapshot(4, state(4.0))
        broken = state(5.0)
        broken["model"]["b"] = torch.empty(4, device="meta")   # copied after "w" is
        with pytest.raises(NotImplementedError):
            mgr.snapshot(5, broken)
    got = state(0.0)
    with CheckpointManager(tmp_path) as again:
        assert again.load_latest(got) == 3
    assert torch.equal(got["model"]["w"], torch.full((1000,), 3.0))
