"""Workers for tests/unit/test_ckpt_plan.py (torch.multiprocessing.spawn children, gloo):
the save plan made once and reused, structures that change, a coordinator that fails,
bitwise round trips, and a checkpoint of the previous format loaded by its ranks.

Every rank's state mixes what a job holds: a replicated plain tensor (DDP's parameters),
one that stays shared in one save and differs by rank in the next, a DTensor sharded over
the ranks, the rank's own RNG state, extras partly its own. Values are functions of the
rank and the step, so a swap or a stale value is visible.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

PLANNING = ("all_reduce_max", "gather_bytes", "scatter_bytes", "broadcast_int")


def mixed_state(rank: int, world: int, step: int, *, differ: bool = False,
                extra: bool = False) -> dict:
    """One rank's state at ``step``; ``differ``: "model.b" differs on the last rank;
    ``extra``: rank 1 holds a tensor no other rank holds."""
    import torch
    import torch.distributed as dist

    state = {"model": {"w": torch.arange(64.0) + step,
                       "b": torch.full((8,), float(step), dtype=torch.bfloat16),
                       "n": torch.tensor([step, -step], dtype=torch.int64)},
             "rng": torch.full((16,), (rank + 7 * step) % 256, dtype=torch.uint8),
             "step": step, "seed": {"rank": 1000 + rank, "lr": 0.5}}
    if differ and rank == world - 1:
        state["model"]["b"] += 1
    if extra and rank == 1:
        state["only1"] = torch.arange(5.0) * step
    if dist.is_initialized():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        full = torch.arange(12.0 * 4).reshape(12, 4) + step
        state["model"]["rows"] = distribute_tensor(full, mesh, [Shard(0)])
        state["model"]["cols"] = distribute_tensor(full.double(), mesh, [Shard(1)])
    return state


def loaded(rank: int, world: int, step: int, **kw: bool) -> dict:
    """What a load of ``mixed_state(rank, world, step, **kw)``'s step gives rank ``rank``:
    its own state, and rank 1's tensor that the others lack (a saved key a state lacks is
    added)."""
    state = mixed_state(rank, world, step, **kw)
    if kw.get("extra"):
        state["only1"] = mixed_state(1, world, step, **kw)["only1"]
    return state


def blank(like: dict) -> dict:
    """``like`` with every tensor zeroed (DTensors as DTensors) and every extra wrong."""
    import torch

    out: dict = {}
    for key, value in like.items():
        if isinstance(value, dict):
            out[key] = blank(value)
        elif isinstance(value, torch.Tensor):
            out[key] = torch.zeros_like(value)
        else:
            out[key] = None
    return out


def same(got: Any, want: Any, where: str = "") -> None:
    """Bitwise equal trees: the same keys, dtypes, shapes and bytes."""
    import torch

    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (where, got, want)
        for key in want:
            same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, torch.Tensor):
        if hasattr(want, "full_tensor"):
            got, want = got.full_tensor(), want.full_tensor()
        assert got.dtype == want.dtype and got.shape == want.shape, (where, got, want)
        assert torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8)), \
            (where, got, want)
    else:
        assert got == want, (where, got, want)


class Spy:
    """Counts a manager's collectives (the real ones still run) and the bytes each gives
    back to this rank."""

    def __init__(self, comm: Any) -> None:
        self.calls: Counter = Counter()
        self.received: Counter = Counter()
        for name in PLANNING + ("all_gather", "gather", "broadcast"):
            setattr(comm, name, self._wrap(name, getattr(comm, name)))

    def _wrap(self, name: str, real: Callable) -> Callable:
        def spied(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            self.calls[name] += 1
            if name == "all_reduce_max":
                self.received[name] += 8 * len(out)
            elif name == "scatter_bytes":
                self.received[name] += len(out)
            elif name == "broadcast_int":
                self.received[name] += 8
            elif name == "gather_bytes" and out is not None:
                self.received[name] += sum(map(len, out))
            return out
        return spied

    def snapshot(self) -> tuple[Counter, Counter]:
        return Counter(self.calls), Counter(self.received)


def _start(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _end() -> None:
    import torch.distributed as dist

    dist.destroy_process_group()
    gc.collect()  # else the exit can abort (hpctrain/runtime/teardown.py)


def plan_reuse(rank: int, world: int, root: str, port: int, out: str) -> None:
    """Four saves: the plan made; reused while values change; made again when one rank's
    structure changes; reused with that rank's structure still its own. Every step loads
    back bitwise on every rank; what each save cost in collectives goes to ``out``."""
    from hpctrain.checkpoint import CheckpointManager

    _start(rank, world, port)
    try:
        saves = [dict(step=1), dict(step=2, differ=True), dict(step=3, extra=True),
                 dict(step=4, extra=True)]
        costs = []
        with CheckpointManager(root, keep_last=10) as mgr:
            spy = Spy(mgr.comm)
            for kw in saves:
                calls, got = spy.snapshot()
                mgr.save(kw["step"], mixed_state(rank, world, **kw))
                after, received = spy.snapshot()
                costs.append({"calls": dict(after - calls), "received": dict(received - got),
                              "plans": mgr.plans.plans, "hits": mgr.plans.hits})
            for kw in saves:
                back = blank(mixed_state(rank, world, **kw))
                mgr.load(kw["step"], back)
                same(back, loaded(rank, world, **kw), f"step {kw['step']}")
        Path(out, f"rank{rank}.json").write_text(json.dumps(costs))
    finally:
        _end()


def damaged_record(rank: int, world: int, root: str, port: int) -> None:
    """After the test damaged the last rank's record of step 4, every rank loads step 3
    (a rank reads only its own record; the others hear of the damage and skip with it)."""
    import warnings

    from hpctrain.checkpoint import CheckpointManager

    _start(rank, world, port)
    try:
        back = blank(mixed_state(rank, world, 3, extra=True))
        with CheckpointManager(root, keep_last=10) as mgr, warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert mgr.load_latest(back) == 3
        same(back, loaded(rank, world, 3, extra=True), "step 3")
    finally:
        _end()


def coordinator_fails(rank: int, world: int, root: str, port: int) -> None:
    """Rank 0's planning raises, in a sync and an async save of a changed structure: every
    rank fails with its message, nothing is committed; then the plan is made and used."""
    from hpctrain.checkpoint import CheckpointManager, replicas
    from hpctrain.errors import CheckpointError

    _start(rank, world, port)
    real = replicas.plan_writes
    try:
        for first, async_save in ((1, False), (11, True)):
            with CheckpointManager(root, keep_last=10, async_save=async_save) as mgr:
                mgr.save(first, mixed_state(rank, world, first))
                mgr.wait()
                if rank == 0:
                    replicas.plan_writes = _boom
                try:
                    mgr.save(first + 1, mixed_state(rank, world, first + 1, extra=True))
                    mgr.wait()
                    raise AssertionError(f"step {first + 1} should have failed")
                except CheckpointError as exc:
                    text = str(exc)
                    assert f"step {first + 1} was not saved" in text, text
                    assert "save plan failed on rank 0" in text, text
                    assert "RuntimeError: the coordinator broke" in text, text
                    assert f"the previous checkpoint (step {first}) is intact" in text, text
                replicas.plan_writes = real
                assert mgr.latest_step() == first and mgr.plans.plan is None
                mgr.save(first + 1, mixed_state(rank, world, first + 1, extra=True))
                mgr.wait()
                back = blank(mixed_state(rank, world, first + 1, extra=True))
                mgr.load(first + 1, back)   # from storage (load_latest: the async snapshot)
                same(back, loaded(rank, world, first + 1, extra=True), f"step {first + 1}")
    finally:
        replicas.plan_writes = real
        _end()


def _boom(groups: Any) -> Any:
    raise RuntimeError("the coordinator broke")


def coordinator_killed(rank: int, world: int, root: str, port: int, out: str) -> None:
    """Rank 0 is killed while it plans; the others write what they got and how long it
    took to ``out``, and leave (their process group is broken)."""
    from hpctrain.checkpoint import CheckpointManager, coordinator, storage
    from hpctrain.errors import CheckpointError

    _start(rank, world, port)
    mgr = CheckpointManager(root, keep_last=10)
    mgr.save(1, mixed_state(rank, world, 1))
    if rank == 0:
        os.environ[storage.FAULT_ENV] = coordinator.FAULT
    start, result = time.monotonic(), "saved"
    try:
        mgr.save(2, mixed_state(rank, world, 2, extra=True))
    except CheckpointError as exc:
        result = str(exc)
    Path(out, f"rank{rank}.json").write_text(json.dumps(
        {"error": result, "seconds": time.monotonic() - start}))
    os._exit(0)   # rank 0 is gone: the group cannot be torn down together


def round_trip(rank: int, world: int, root: str, port: int) -> None:
    """Save sync and async at ``world`` ranks; every rank loads both back bitwise."""
    from hpctrain.checkpoint import CheckpointManager

    if world > 1:
        _start(rank, world, port)
    try:
        for step, async_save in ((1, False), (2, True)):
            with CheckpointManager(root, keep_last=10, async_save=async_save) as mgr:
                mgr.save(step, mixed_state(rank, world, step, differ=True))
                mgr.wait()
                want = mixed_state(rank, world, step, differ=True)
                back = blank(want)
                mgr.load(step, back)
                same(back, want, f"{world} ranks, step {step}")
    finally:
        if world > 1:
            _end()


def old_format(rank: int, world: int, root: str, port: int) -> None:
    """tests/data/ckpt-0.7 (format 4, 2 ranks) loads on each of its ranks with the rank's
    own values; the next save beside it is format 5 and loads back too."""
    from hpctrain.checkpoint import CheckpointManager
    from programs.ckpt_rank_worker import blank as rank_blank
    from programs.ckpt_rank_worker import check_own, own_state

    _start(rank, world, port)
    try:
        with CheckpointManager(root) as mgr:
            back = rank_blank(world)
            assert mgr.load_latest(back) == 3
            check_own(back, rank)
            assert back["model"]["w"].full_tensor().equal(
                own_state(rank, world)["model"]["w"].full_tensor())
            mgr.save(4, own_state(rank, world))
            again = rank_blank(world)
            assert mgr.load_latest(again) == 4
            check_own(again, rank)
    finally:
        _end()
