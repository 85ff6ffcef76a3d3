"""Worker for the world-size-2 test (imported by torch.multiprocessing.spawn children)."""

from __future__ import annotations

import gc
import os


def full_weight():
    import torch

    return torch.arange(64 * 6, dtype=torch.float32).reshape(64, 6)


def worker(rank: int, world: int, root: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from hpctrain.checkpoint import CheckpointManager
    from hpctrain.errors import CheckpointError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        w = distribute_tensor(full_weight(), mesh, [Shard(0)])
        state = {"model": {"w": w, "b": torch.arange(6.0)}, "step": 5,
                 "rank_rng": {"seed": 100 + rank}}
        mgr = CheckpointManager(root, async_save=True)  # collectives from the writer thread
        mgr.save(5, state)
        mgr.wait()
        # one rank failing (an unpicklable extra on rank 1 only) fails the step on all
        # ranks, without a hang, and leaves step 5 as it was
        bad = dict(state, hook=(lambda: None) if rank == 1 else None)
        mgr.save(6, bad)
        try:
            mgr.wait()
            raise AssertionError("step 6 should have failed")
        except CheckpointError as exc:
            assert "step 6 was not saved" in str(exc) and "step 5" in str(exc), exc
        assert mgr.latest_step() == 5
        # reload on the same world size but a different layout (columns instead of rows)
        w2 = distribute_tensor(torch.zeros(64, 6), mesh, [Shard(1)])
        back = {"model": {"w": w2, "b": torch.zeros(6)}}
        assert mgr.load_latest(back) == 5
        assert torch.equal(w2.full_tensor(), full_weight())
        assert torch.equal(back["model"]["b"], torch.arange(6.0))
        assert back["rank_rng"] == {"seed": 100 + rank}  # per-rank extras come back per rank
        mgr.close()
        # the same failure in a sync save: every rank passes the fingerprint exchange
        # (after its first writes) and raises, and step 5 is still the latest
        with CheckpointManager(root) as sync:
            try:
                sync.save(6, bad)
                raise AssertionError("sync step 6 should have failed")
            except CheckpointError as exc:
                assert "step 6 was not saved" in str(exc), exc
            assert sync.latest_step() == 5
    finally:
        dist.destroy_process_group()
        gc.collect()  # else the exit can abort (hpctrain/runtime/teardown.py)
