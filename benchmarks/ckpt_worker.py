"""One rank of the checkpoint benchmark (run under torchrun by benchmarks/ckpt_bench.py).

Every repetition measures, on the same state and the same disk, in an order that rotates
from one repetition to the next (the disk's speed drifts on a shared machine):

* saves, durable (fsynced) when they return: hpctrain, ``dcp.save``, ``torch.save``, and
  the plainest durable write of the same bytes by the same ranks (``raw``: each rank
  ``write()``s its share of the tensors' bytes, then fsyncs): what no saver can beat by
  much, since all of them must get these bytes onto the disk. Before each save the
  previous saves' deletions are finished and synced, untimed: a training loop deletes old
  checkpoints long before its next save, and the file system's deferred work for a
  deletion (journal commit, discards) would otherwise land in the next contender's fsync;
* the training loop's stall of an async save: hpctrain's ``async_save=True`` and
  ``dcp.async_save``, against one in-memory copy of the state into preallocated memory;
* cold loads (page cache dropped before each), every one checked equal to what was
  saved: hpctrain (checksums verified), ``dcp.load``, ``torch.load(mmap=True)`` plus the
  copy into the live tensors;
* fio's sequential write and read (O_DIRECT, 4 MiB blocks, iodepth 8) of the same number
  of bytes, by rank 0 alone, as the disk's ceiling.

The state is a transformer-like mix (a few large matrices, many small vectors) of model
weights and Adam's two moments: ``plain`` is replicated on every rank (DDP), ``sharded``
is DTensors with ``Shard(0)`` over all ranks (FSDP2/TP), so each rank holds 1/N of it.
Rank 0 writes the figures as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from hpctrain.checkpoint import CheckpointManager

ROWS = 1024  # every tensor is ROWS x n: Shard(0) splits its rows evenly for N in 1, 2, 4


def make_state(nbytes: int, sharded: bool, mesh) -> dict:
    """Model + Adam moments of about ``nbytes`` float32 in total (across ranks)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    gen = torch.Generator().manual_seed(0)  # the same values on every rank
    per_third = nbytes // 3 // 4 // ROWS
    cols, left = [], per_third
    while left > 0:
        cols.append(min(left, 4096))
        left -= cols[-1]
    cols += [1] * 64  # the small vectors (norms, biases)

    def tensor(n: int) -> torch.Tensor:
        t = torch.randn(ROWS, n, generator=gen)
        return distribute_tensor(t, mesh, [Shard(0)]) if sharded else t
    model = {f"layer{i}.weight": tensor(n) for i, n in enumerate(cols)}
    optim = {f"layer{i}": {"exp_avg": tensor(n), "exp_avg_sq": tensor(n).abs()}
             for i, n in enumerate(cols)}
    return {"model": model, "optim": optim, "step": 10}


def leaves(state: dict) -> list[torch.Tensor]:
    out = []
    for v in state.values():
        if isinstance(v, dict):
            out += leaves(v)
        elif isinstance(v, torch.Tensor):
            out.append(v)
    return out


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def zeros_like_state(state: dict) -> dict:
    """A destination as a live model is: the same layout, every page touched."""
    out: dict = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out[k] = zeros_like_state(v)
        elif isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v)  # a DTensor stays one, with the same placement
        else:
            out[k] = 0
    return out


def equal(a: dict, b: dict) -> bool:
    return all(torch.equal(local(x), local(y)) for x, y in zip(leaves(a), leaves(b)))


def drop_caches() -> None:
    """Rank 0 drops the page cache (every rank is on this machine); the others wait."""
    dist.barrier()
    if dist.get_rank() == 0:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    dist.barrier()


def timed(fn: Callable[[], object]) -> float:
    """Wall time of a collective ``fn``: from a barrier to the last rank's return."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def max_over_ranks(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def fio(work: Path, nbytes: int, rw: str) -> float:
    """fio's throughput (bytes/s) for a sequential O_DIRECT ``rw`` of ``nbytes`` (rank 0)."""
    target = work / "fio.bin"
    proc = subprocess.run(
        ["fio", "--name=ceiling", f"--filename={target}", f"--rw={rw}", "--bs=4M",
         "--iodepth=8", "--ioengine=libaio", "--direct=1", f"--size={nbytes}",
         "--end_fsync=1", "--output-format=json"],
        capture_output=True, text=True, check=True, timeout=600)
    job = json.loads(proc.stdout)["jobs"][0]
    return float(job["write" if rw == "write" else "read"]["bw_bytes"])


class Contenders:
    """The savers and loaders of one run, each with its own directory under ``work``."""

    def __init__(self, work: Path, state: dict, sharded: bool) -> None:
        self.work, self.state, self.sharded = work, state, sharded
        self.rank = dist.get_rank()
        for name in ("hp", "hp-async"):
            (work / name).mkdir(parents=True, exist_ok=True)
        dist.barrier()
        self.hp = CheckpointManager(work / "hp", keep_last=1)
        self.hp_async = CheckpointManager(work / "hp-async", keep_last=1, async_save=True)
        self.step = 0
        self.dests = [torch.empty_like(local(t)) for t in leaves(state)]

    # saves
    def hp_save(self) -> None:
        self.step += 1
        self.hp.save(self.step, self.state)

    def settle(self, name: str) -> None:
        """Not timed, before save ``name``: its last checkpoint deleted (DCP, torch.save
        and the raw write; hpctrain's save deletes its previous step itself, as keep_last=1
        asks, on a background thread), every deletion finished, and all of it synced, so
        no save pays for another's deletion."""
        for removal in self.hp._removals:
            removal.result()
        dist.barrier()
        if self.rank == 0:
            if name == "dcp_save":
                shutil.rmtree(self.work / "dcp", ignore_errors=True)
            old = {"torch_save": "torch-*.pt", "raw_save": "raw-*.bin"}.get(name)
            for path in self.work.glob(old) if old else ():
                path.unlink()
            os.sync()
        dist.barrier()

    def dcp_save(self) -> None:
        dcp.save(self.state, checkpoint_id=str(self.work / "dcp"))

    def raw_save(self) -> None:
        """Each rank writes the bytes of its share of the tensors (all of its shards; a
        replicated state split between the ranks) with write(), then fsyncs."""
        world = dist.get_world_size()
        tensors = leaves(self.state) if self.sharded else leaves(self.state)[self.rank::world]
        with open(self.work / f"raw-{self.rank}.bin", "wb", buffering=0) as f:
            for t in tensors:
                f.write(local(t).numpy().data.cast("B"))
            os.fsync(f.fileno())

    def torch_path(self) -> Path:
        return self.work / f"torch-{self.rank}.pt"

    def torch_save(self) -> None:
        # DDP users save on rank 0; sharded users save each rank's shards
        if self.sharded or self.rank == 0:
            local_state = {"t": [local(t) for t in leaves(self.state)], "step": 10}
            with open(self.torch_path(), "wb") as f:
                torch.save(local_state, f)
                f.flush()
                os.fsync(f.fileno())

    # the loop's stall of an async save, on the slowest rank
    def hp_async_stall(self) -> float:
        self.step += 1
        dist.barrier()
        t0 = time.perf_counter()
        self.hp_async.save(self.step, self.state)
        stall = time.perf_counter() - t0
        self.hp_async.wait()
        return max_over_ranks(stall)

    def dcp_async_stall(self) -> float:
        target = self.work / "dcp-async"
        if self.rank == 0:
            shutil.rmtree(target, ignore_errors=True)
        dist.barrier()
        t0 = time.perf_counter()
        future = dcp.async_save(self.state, checkpoint_id=str(target))
        stall = time.perf_counter() - t0
        future.result()
        return max_over_ranks(stall)

    def copy_stall(self) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for d, t in zip(self.dests, leaves(self.state)):
            d.copy_(local(t))
        return max_over_ranks(time.perf_counter() - t0)

    # loads, each into a fresh destination and checked
    def hp_load(self, dest: dict) -> None:
        self.hp.load(self.step_of(self.hp), dest)

    @staticmethod
    def step_of(mgr: CheckpointManager) -> int:
        step = mgr.latest_step()
        assert step is not None
        return step

    def dcp_load(self, dest: dict) -> None:
        dcp.load(dest, checkpoint_id=str(self.work / "dcp"))

    def torch_load(self, dest: dict) -> None:
        path = self.torch_path() if self.sharded else self.work / "torch-0.pt"
        saved = torch.load(path, mmap=True, weights_only=True)
        for d, s in zip(leaves(dest), saved["t"]):
            local(d).copy_(s)

    def close(self) -> None:
        self.hp.close()
        self.hp_async.close()


def rotate(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


def run(args: argparse.Namespace) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    mesh = init_device_mesh("cpu", (world,))
    sharded = args.layout == "sharded"
    state = make_state(args.size, sharded, mesh)
    local_bytes = sum(local(t).nbytes for t in leaves(state))
    total = local_bytes * (world if sharded else 1)  # the bytes a checkpoint holds
    work = Path(args.dir)
    c = Contenders(work, state, sharded)
    c.hp_async_stall()  # the first async saves allocate their staging memory: not timed
    c.dcp_async_stall()
    c.copy_stall()
    staging = c.hp_async._staging._buffers
    first_ptrs = [b.data_ptr() for b in staging]
    figures: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        figures.setdefault(name, []).append(value)

    saves = [("hp_save", c.hp_save), ("dcp_save", c.dcp_save), ("torch_save", c.torch_save),
             ("raw_save", c.raw_save)]
    stalls = [("hp_async", c.hp_async_stall), ("dcp_async", c.dcp_async_stall),
              ("copy", c.copy_stall)]
    loads = [("hp_load", c.hp_load), ("dcp_load", c.dcp_load), ("torch_load", c.torch_load)]
    for rep in range(args.repeat):
        if rank == 0:
            print(f"  repetition {rep + 1}/{args.repeat}", flush=True)
        dist.barrier()
        if rank == 0:
            add("fio_write", fio(work, total, "write"))
        for name, fn in rotate(saves, rep):
            c.settle(name)
            add(name, timed(fn))
        for name, fn in rotate(stalls, rep):
            add(name, fn())
        for name, fn in rotate(loads, rep):
            dest = zeros_like_state(state)
            drop_caches()
            add(name, timed(lambda fn=fn, dest=dest: fn(dest)))
            ok = torch.tensor([int(equal(dest, state))])
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            assert ok.item() == 1, f"{name}: the loaded state differs from the saved one"
            del dest
        drop_caches()
        dist.barrier()
        if rank == 0:
            add("fio_read", fio(work, total, "read"))
            (work / "fio.bin").unlink()
    staging_bytes = sum(b.nbytes for b in c.hp_async._staging._buffers)
    reused = [b.data_ptr() for b in c.hp_async._staging._buffers] == first_ptrs
    c.close()
    return {"world": world, "layout": args.layout, "bytes": total, "local_bytes": local_bytes,
            "tensors": len(leaves(state)), "figures": figures,
            "staging_bytes": staging_bytes, "staging_reused": reused}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--layout", choices=("plain", "sharded"), required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    try:
        result = run(args)
        if dist.get_rank() == 0:
            Path(args.out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
