"""Workers for tests/unit/test_ckpt_per_rank.py (torch.multiprocessing.spawn children).

Every rank saves what a pipeline stage's raw ``optimizer.state_dict()`` and the docs' own
resume loop save: its own optimizer state and RNG state as plain tensors, beside a DTensor
sharded weight and a plain tensor every rank holds the same, and extras that are partly
its own. The values are a function of the rank, so a swap is visible.
"""

from __future__ import annotations

import gc
import os


def own_state(rank: int, world: int):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.manual_seed(1000 + rank)
    state = {"optim": {"state": {0: {"exp_avg": torch.full((256,), float(rank + 1))}}},
             "rng": torch.get_rng_state(),
             "model": {"bias": torch.arange(8.0)},          # the same on every rank
             "extra": {"seed": 1000 + rank, "lr": 0.1}}
    if dist.is_initialized():
        mesh = init_device_mesh("cpu", (world,))
        state["model"]["w"] = distribute_tensor(torch.arange(64.0).reshape(16, 4), mesh,
                                                [Shard(0)])
    return state


def blank(world: int):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    state = {"optim": {"state": {0: {"exp_avg": torch.zeros(256)}}},
             "rng": torch.zeros_like(torch.get_rng_state()),
             "model": {"bias": torch.zeros(8)}, "extra": {"seed": -1, "lr": 0.0}}
    if dist.is_initialized():
        mesh = init_device_mesh("cpu", (world,))
        state["model"]["w"] = distribute_tensor(torch.zeros(16, 4), mesh, [Shard(0)])
    return state


def check_own(state, rank: int) -> None:
    import torch

    assert torch.equal(state["optim"]["state"][0]["exp_avg"], torch.full((256,), float(rank + 1)))
    torch.manual_seed(1000 + rank)
    assert torch.equal(state["rng"], torch.get_rng_state()), f"rank {rank} got another RNG state"
    assert torch.equal(state["model"]["bias"], torch.arange(8.0))
    assert state["extra"] == {"seed": 1000 + rank, "lr": 0.1}


def save_and_load(rank: int, world: int, roots: list[str], port: int,
                  alongside: bool) -> None:
    """Save sync to roots[0] and async to roots[1]; every rank loads its own values back.
    ``alongside``: the fingerprints are taken while the first chunks are written (as on a
    node with CPUs to spare), else after them (as on this 2-core machine)."""
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager, coordinator

    coordinator.cpus_per_rank = lambda nodes: [2.0 if alongside else 1.0] * len(nodes)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for root, async_save in zip(roots, (False, True)):
            with CheckpointManager(root, async_save=async_save) as mgr:
                mgr.save(3, own_state(rank, world))
                mgr.wait()
                back = blank(world)
                assert mgr.load_latest(back) == 3
                check_own(back, rank)
                assert back["model"]["w"].full_tensor().equal(
                    own_state(rank, world)["model"]["w"].full_tensor())
    finally:
        dist.destroy_process_group()
        gc.collect()  # else the exit can abort (hpctrain/runtime/teardown.py)


def grown_world(rank: int, world: int, root: str, port: int) -> None:
    """Load a step saved by fewer ranks: the shared values load on every rank; a rank the
    step has nothing of its own for gets a clear error when it asks for a per-rank value."""
    import torch
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager
    from hpctrain.errors import CheckpointError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        with CheckpointManager(root) as mgr:
            saved_by = mgr.list()[-1].world_size
            shared = {"model": {"bias": torch.zeros(8)}, "extra": {"lr": 0.0}}
            assert mgr.load_latest(shared) == 3
            assert torch.equal(shared["model"]["bias"], torch.arange(8.0))
            if rank < saved_by:  # its own extras, whole
                assert shared["extra"] == {"lr": 0.1, "seed": 1000 + rank}, shared
            else:                # rank 0's, without the ones that differ by rank
                assert shared["extra"] == {"lr": 0.1}, shared
            # rank saved_by has no RNG state of its own in the step: its refusal is every
            # rank's (load is collective), and no rank's state is written
            mine = {"rng": torch.zeros_like(torch.get_rng_state())}
            try:
                mgr.load(3, mine)
                raise AssertionError(f"rank {rank}: a load that rank {saved_by} refused")
            except CheckpointError as exc:
                assert "different tensor ['rng']" in str(exc), exc
                assert f"resume with {saved_by} ranks" in str(exc), exc
            assert not mine["rng"].any()
    finally:
        dist.destroy_process_group()
        gc.collect()  # else the exit can abort (hpctrain/runtime/teardown.py)
