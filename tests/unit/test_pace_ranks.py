"""The pace measure and the detector together, on real gloo process groups of four ranks
(two "nodes" of two), in the cases an adversarial run (2026-11-29) found them wrong: rank 0
doing more work than the rest (not a slow node), a collective imported before the runtime
started (still a wait), a collective on another thread (an async checkpoint's commit: not
the step's wait), DDP with a node slow outside forward and backward (its gradient wait
taken out). Sleep stands for work, so the 2-core machine's contention does not matter;
each rank's Pace installed as the runtime does (hpctrain.runtime.pace.install), the
figures fed to the detector as the supervisor would."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hpctrain.protocol.dialog import Attempt
from hpctrain.protocol.progress import Progress
from hpctrain.supervisor.slow import LOOK_S, SlowWatch

pytestmark = pytest.mark.torch

WORLD, PER_NODE, STEPS = 4, 2, 12


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, scenario: str, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if scenario == "imported":
        from torch.distributed import all_reduce as early_all_reduce   # noqa: F401
    from hpctrain.runtime import pace
    p = pace.install(pace.Pace())
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    p.resume()
    side = dist.new_group(backend="gloo") if scenario == "thread" else None
    t = torch.ones(10)
    p.boundary()
    writer = None
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64)) \
        if scenario == "ddp_input" else None
    for step in range(STEPS):
        if ddp is not None:
            # n2's input pipeline is slow (a throttled CPU decoding, a slow local disk):
            # its ranks take 0.3 s a step of their own, the others 0.1 s and wait in
            # DDP's all-reduce
            time.sleep(0.30 if rank >= PER_NODE else 0.10)
            ddp(torch.randn(32, 64)).sum().backward()
            p.boundary()
            continue
        time.sleep(0.10)                                  # every rank's compute
        if scenario == "rank0_logs" and rank == 0:
            time.sleep(0.08)                              # rank 0 logs / evaluates
        if scenario in ("imported",) and rank >= PER_NODE:
            time.sleep(0.20)                              # node n2 is slow
        if scenario == "imported":
            early_all_reduce(t)
        elif scenario == "thread":
            # an async checkpoint save every step (CheckpointManager(async_save=True)):
            # its commit protocol runs on its own gloo group from the writer thread
            # (hpctrain.checkpoint.comm: "they may run from the async writer thread");
            # ranks 1-3 wait there for rank 0's longer write. The next save first waits
            # for the last one, in phase saving (paused), as CheckpointManager.wait does.
            p.pause()
            if writer is not None:
                writer.join()
            p.resume()

            def commit() -> None:
                if rank == 0:
                    time.sleep(0.09)                      # rank 0 writes the manifest
                dist.barrier(group=side)
            writer = threading.Thread(target=commit)
            writer.start()
            dist.all_reduce(t)
        else:
            dist.all_reduce(t)
        p.boundary()
    out.put((rank, p.own()))
    dist.barrier()
    dist.destroy_process_group()


def measure(scenario: str) -> dict[int, float]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, scenario, q)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    got = dict(q.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(60)
    return got


def detect(own: dict[int, float], seconds: float = 60.0) -> list[str]:
    watch, t, found = SlowWatch(), 0.0, []
    while t < seconds:
        step = int(t / 0.2)
        recs = {r: Progress(r, Attempt("run", 0, 0), 0.0, 0.0, node=f"n{r // PER_NODE + 1}",
                            step=str(step), boundaries=step, phase="training", own=s)
                for r, s in own.items()}
        found += [f.node or "job" for f in watch.look(recs, t) if f.rank is None]
        t += LOOK_S
    return found


def test_rank0_only_logging_is_not_a_slow_node() -> None:
    """Rank 0 spends 80 ms a step logging (ranks 1-3 wait for it in the all_reduce): every
    node's hardware is equal; the job is not 'paced by a slow node'."""
    own = measure("rank0_logs")
    print("own per rank", own)
    assert detect(own) == [], f"false alarm: {own}"


def test_a_collective_imported_before_the_runtime_still_counts_as_a_wait() -> None:
    """`from torch.distributed import all_reduce` at the top of a script (before
    hpctrain.runtime.init): n2 is 3x slower and the others wait for it every step."""
    own = measure("imported")
    print("own per rank", own)
    assert detect(own) == ["n2"], f"n2 missed: {own}"


def test_a_collective_in_another_thread_is_not_the_training_loops_wait() -> None:
    """A background thread's collective (the async checkpoint writer's commit) is not the
    training loop's wait: every rank's loop does the same 0.10 s of work a step, so no node
    may be named, and each figure should be ~0.10 s."""
    own = measure("thread")
    print("own per rank", own)
    assert detect(own) == [], f"false alarm: {own}"
    assert all(v == pytest.approx(0.10, abs=0.03) for v in own.values()), own


def test_ddp_a_node_slow_outside_forward_and_backward_is_named() -> None:
    """Under DistributedDataParallel a node slow outside forward and backward (its input
    pipeline) shows: the others' wait for it is DDP's gradient wait, taken out."""
    own = measure("ddp_input")
    print("own per rank", own)
    # n2's ranks spend 0.2 s a step more of their own than n1's: the figure shows it
    assert min(own[2], own[3]) - max(own[0], own[1]) > 0.15, f"n2's 0.2 s unseen: {own}"
    assert detect(own) == ["n2"], own
