"""What peer copies of snapshots cost per training step (issue 42, item 4), as a ratio
against the same loop without them, measured in one run:

    .venv/bin/python benchmarks/peer_bench.py [--params 4M] [--rounds 12] [--block 8]

Four ranks as srun starts them (their own processes, gloo), on two emulated nodes
(``$SLURMD_NODENAME`` n1, n1, n2, n2; node memory under a temporary directory), train a
data-parallel MLP of --params parameters with SGD and momentum (the state a snapshot
copies: weights and moments, 8 bytes a parameter), all-reducing each gradient, in three
ways:

- ``none``: no snapshot;
- ``snapshot``: ``CheckpointManager.snapshot`` after every step (host memory only);
- ``peers``: the same through a second manager with peer copies on
  (``$HPCTRAIN_PEER_COPIES=1``): each snapshot also written into node memory, checksummed
  and sent to the partner on the other node.

The three take turns in the same processes, --block steps each, --rounds times (the
order rotates each round): the machine's noise (a 2-core VM whose step times drift by 10%
from one start of the processes to the next) falls on all three alike, and each round
gives one ratio. A ``peers`` block's time includes waiting, after its last step, for that
step's copy to be sent (which a longer run would overlap with the next step): the cost is
counted in full, not hidden in the next block.

Figures: per mode the median over rounds of the block's mean step time (rank 0), and the
median of the rounds' ratios peers/snapshot (what peer copies add to a loop that
snapshots every step: target <= 1.05) and peers/none. This default mode is the *all-CPU
worst case*: four ranks' training fills the machine's cores, so every CPU cycle the copies
take is a cycle the training loses.

``--gpu-standin`` measures the cost as a GPU node has it (issue 55, item 7):

    .venv/bin/python benchmarks/peer_bench.py --gpu-standin [--snapshot-mb 256]
        [--step-s 0.25,0.5,1,2] [--allreduce-mb 4] [--rounds 3] [--block 4]

Each step's forward/backward is ``time.sleep(step_s)``: a STAND-IN for the accelerator's
time, which leaves the host CPU idle as a GPU node's training does. It is not a GPU
measurement: no device, no device->host copy (``snapshot()`` copies host memory to host
memory here, where a GPU node copies device to host), no NCCL. What is real: the state,
--snapshot-mb MiB per rank of float32 tensors (weights and momentum alike, --tensors of
each), snapshotted through ``CheckpointManager.snapshot`` every --snapshot-every steps in
the same three modes (node memory under a temporary directory of ``/dev/shm``, as a node's
is); and each step's gloo all_reduce of a --allreduce-mb MiB gradient (``full``: the
weights' size, half the snapshot). For each --step-s the three modes take turns as above,
and it reports:

- the step-time ratios peers/snapshot (target <= 1.05) and peers/none on the SLOWEST rank
  (per round, the largest of the four ranks' block means; the median over rounds). A
  block's time ends with its last step: the last copy's send overlaps the next step in a
  longer run, so the time the block then waits for it (``drain``) is reported beside, and
  a ratio with it counted in full too;
- the median time blocked inside ``snapshot()`` per mode (all ranks' snapshots);
- the copy's CPU per snapshot: a rank's process CPU per step in ``peers`` less in
  ``snapshot`` (its checksums, its send and its ward's receive), and the CPU of the peer
  threads alone (``hpctrain-peer-*``, by name: :func:`peer_thread_cpu`);
- the copy's latency: from ``snapshot()``'s return until PeerCopies counts the copy sent
  whole (its ``sent`` counter: the partner's acknowledgement that the copy is whole there,
  in the peers.py of issue 55; before it, the send's end). A thread waits in
  ``PeerCopies.flush()`` (no CPU) and checks the counter (:func:`copy_counters`); and how
  many of the copies were sent whole (a send still on its way at the next snapshot is cut
  short);
- the bandwidth the snapshot size and step time imply (per rank, per node of 2 and of 8).

Every step time's figures are also printed as one line of JSON (``PEER_STANDIN {...}``).
This machine's cores are shared by four ranks (a GPU node has many per rank): the copies'
CPU here is a worst case for the stand-in too.

Nothing here needs Slurm; the node-loss figures (loss -> first step on the spare, steps
lost) come from tests/cluster/test_peer_copies_cluster.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "snapshot", "peers")


def worker(args: argparse.Namespace) -> None:
    if args.gpu_standin:
        return standin_worker(args)
    import torch
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    width = int((args.params / 2) ** 0.5)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    managers = {}
    for mode, peers in (("snapshot", "0"), ("peers", "1")):     # (collective, in order)
        os.environ["HPCTRAIN_PEER_COPIES"] = peers
        managers[mode] = CheckpointManager(Path(args.dir) / mode, keep_last=1)
    copies = managers["peers"]._memory.peers
    assert copies is not None, "peer copies did not start"
    step = 0

    def steps(mode: str, n: int) -> float:
        """``n`` steps in ``mode``: their mean time (after the last copy's send)."""
        nonlocal step
        mgr = managers.get(mode)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            x = torch.randn(args.batch, width,
                            generator=torch.Generator().manual_seed(step * 10 + rank))
            opt.zero_grad()
            model(x).square().mean().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            step += 1
            if mgr is not None:
                t1 = time.perf_counter()
                mgr.snapshot(step, {"model": model.state_dict(), "opt": opt.state_dict()})
                stalls[mode].append(time.perf_counter() - t1)
        if mode == "peers":
            copies.flush()
        dist.barrier()
        cpu[mode].append((time.process_time() - c0) / n)
        return (time.perf_counter() - t0) / n

    stalls: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for mode in MODES:
        steps(mode, args.warmup)
    stalls, cpu = {m: [] for m in MODES}, {m: [] for m in MODES}
    sent0, puts0 = copies.sent, copies.puts
    blocks: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES[r % 3:] + MODES[:r % 3]:
            blocks[mode].append(steps(mode, args.block))
    sent = [copies.sent - sent0, copies.puts - puts0]
    for mgr in managers.values():
        mgr.close()
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "blocks": blocks, "sent": sent,
            "cpu": {m: statistics.median(v) for m, v in cpu.items()},
            "stalls": {m: statistics.median(v) if v else 0.0 for m, v in stalls.items()}}))
    dist.barrier()
    dist.destroy_process_group()


# ---- the GPU-node stand-in (--gpu-standin) --------------------------------------------------
# What this mode reads of hpctrain's internals, each in one place (peers.py is being
# rewritten: a rename breaks these three functions, not the measurement).
def peer_copies_of(mgr) -> object:
    """The manager's PeerCopies (``mgr._memory.peers``), or None."""
    return mgr._memory.peers


def copy_counters(copies) -> tuple[int, int]:
    """(snapshots put, snapshots sent whole to the partner: acknowledged by it) so far:
    PeerCopies' counters."""
    return copies.puts, copies.sent


def peer_thread_cpu(since: dict[int, float] | None = None) -> tuple[float, dict[int, float]]:
    """CPU seconds of this process's peer-copy threads (found by the name peers.py gives
    them, ``hpctrain-peer-*``) since ``since`` (their CPU clocks then), and their clocks
    now. A thread that ended meanwhile (a receiving thread whose ward reconnected after a
    send cut short) takes its CPU since ``since`` with it: an underestimate then."""
    now = {}
    for t in threading.enumerate():
        if t.name.startswith("hpctrain-peer") and t.ident is not None:
            try:
                now[t.ident] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except OSError:
                pass
    since = since or {}
    return sum(c - since.get(i, 0.0) for i, c in now.items()), now


class CopyWatch:
    """The latency of each peer copy, measured from outside PeerCopies: a thread given each
    snapshot's return time waits in ``flush()`` (until the copy is sent or given up, no CPU
    while it waits) and counts it as sent whole when the ``sent`` counter moved."""

    def __init__(self, copies) -> None:
        import queue

        self.copies, self.queue = copies, queue.Queue()
        self.latency: list[float] = []
        self.not_whole = 0
        threading.Thread(target=self._run, name="bench-copy-watch", daemon=True).start()

    def returned(self, t: float) -> None:
        """snapshot() returned at ``t`` (perf_counter)."""
        self.queue.put((t, copy_counters(self.copies)[1]))

    def _run(self) -> None:
        while True:
            t, sent = self.queue.get()
            self.copies.flush()
            done = time.perf_counter()
            if copy_counters(self.copies)[1] > sent:
                self.latency.append(done - t)
            else:
                self.not_whole += 1
            self.queue.task_done()

    def take(self) -> tuple[list[float], int]:
        """The latencies and copies not sent whole so far (the watch drained first)."""
        self.queue.join()
        out = (self.latency, self.not_whole)
        self.latency, self.not_whole = [], 0
        return out


def standin_worker(args: argparse.Namespace) -> None:
    import faulthandler

    import torch
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # the state: weights and momentum alike, args.tensors float32 tensors of each
    numel = (args.snapshot_mb << 20) // 4 // (2 * args.tensors)
    gen = torch.Generator().manual_seed(rank)
    weights = {f"w{i}": torch.rand(numel, generator=gen) for i in range(args.tensors)}
    momentum = {f"w{i}": torch.rand(numel, generator=gen) for i in range(args.tensors)}
    state = {"model": weights, "opt": {"momentum": momentum, "step": 0}}
    grad = torch.ones(allreduce_bytes(args) // 4)
    managers = {}
    for mode, peers in (("snapshot", "0"), ("peers", "1")):     # (collective, in order)
        os.environ["HPCTRAIN_PEER_COPIES"] = peers
        managers[mode] = CheckpointManager(Path(args.dir) / mode, keep_last=1)
    copies = peer_copies_of(managers["peers"])
    assert copies is not None, "peer copies did not start"
    watch = CopyWatch(copies)
    step = 0
    rec: dict = {}

    def steps(mode: str, n: int, step_s: float) -> None:
        """``n`` steps in ``mode``: their mean time (to the last step's end), the drain (the
        wait after it for its copy to be sent), the process's and peer threads' CPU a step
        (the drain included)."""
        nonlocal step
        mgr = managers.get(mode)
        # a copy thread that died (or a hang) ends the run with every thread's stack
        faulthandler.dump_traceback_later(120 + 5 * n * step_s, exit=True)
        t0, c0 = time.perf_counter(), time.process_time()
        _, p0 = peer_thread_cpu()
        for _ in range(n):
            time.sleep(step_s)            # STAND-IN: the accelerator's forward/backward
            ta = time.perf_counter()
            dist.all_reduce(grad)         # real: the gradient's all-reduce (gloo)
            grad.div_(world)
            rec["allreduce"][mode].append(time.perf_counter() - ta)
            step += 1
            weights["w0"][0] = step       # the update (on the accelerator: costs nothing)
            state["opt"]["step"] = step
            if mgr is not None and step % args.snapshot_every == 0:
                t1 = time.perf_counter()
                mgr.snapshot(step, state)
                t2 = time.perf_counter()
                rec["stalls"][mode].append(t2 - t1)
                if mode == "peers":
                    watch.returned(t2)
        t_end = time.perf_counter()
        if mode == "peers":
            copies.flush()
        t_drained = time.perf_counter()
        rec["cpu"][mode].append((time.process_time() - c0) / n)
        rec["thread_cpu"][mode].append(peer_thread_cpu(p0)[0] / n)
        rec["blocks"][mode].append((t_end - t0) / n)
        rec["drain"][mode].append(t_drained - t_end)
        dist.barrier()
        faulthandler.cancel_dump_traceback_later()

    def fresh() -> dict:
        return {k: {m: [] for m in MODES}
                for k in ("blocks", "drain", "cpu", "thread_cpu", "stalls", "allreduce")}

    rec.update(fresh())
    for mode in MODES:   # staging buffers and the ward's slots mapped, their pages touched
        steps(mode, args.warmup, max(args.step_s))   # (copies not cut short: all of them)
    watch.take()
    results = []
    for step_s in args.step_s:
        rec.update(fresh())
        puts0, sent0 = copy_counters(copies)
        for r in range(args.rounds):
            for mode in MODES[r % 3:] + MODES[:r % 3]:
                steps(mode, args.block, step_s)
        latency, not_whole = watch.take()
        puts, sent = copy_counters(copies)
        results.append({**rec, "step_s": step_s, "latency": latency, "not_whole": not_whole,
                        "puts": puts - puts0, "sent": sent - sent0})
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(results, gathered, dst=0)
    for mgr in managers.values():
        mgr.close()
    if rank == 0:
        Path(args.out).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def allreduce_bytes(args: argparse.Namespace) -> int:
    """The gradient all-reduced each step: --allreduce-mb MiB, or (``full``) the weights."""
    if args.allreduce_mb == "full":
        return (args.snapshot_mb << 20) // 2
    return int(float(args.allreduce_mb) * (1 << 20)) // 4 * 4


def gbit(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 2**20:.0f} MiB/s = {bytes_per_s * 8 / 1e9:.2f} Gbit/s"


def implied_bandwidth(snapshot_mb: float, step_s: float, every: int = 1) -> str:
    """The send bandwidth peer copies of ``snapshot_mb`` MiB a rank every ``every`` steps of
    ``step_s`` need to keep up (each node receives as much as it sends)."""
    rate = snapshot_mb * 2**20 / (step_s * every)
    return (f"{snapshot_mb:g} MiB a rank every {step_s * every:g} s: {gbit(rate)} a rank, "
            f"{gbit(2 * rate)} a node of 2 ranks, {gbit(8 * rate)} a node of 8 ranks "
            f"(each way: a node sends its ranks' copies and receives its wards'), and "
            f"{rate / 2**20:.0f} MiB/s of checksums a rank")


def memory_check(args: argparse.Namespace, shm: Path) -> str:
    """The memory four ranks of --snapshot-mb need (the state, the snapshot manager's
    staging, peer copies' two own buffers and their ward's two slots: 6x a rank's state, 4x
    of it in node memory), against what the machine has: a line to print; SystemExit if it
    does not fit."""
    size = args.snapshot_mb << 20
    need, need_shm = 4 * 6 * size, 4 * 4 * size
    avail = 0
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    st = os.statvfs(shm)
    shm_free = st.f_bavail * st.f_frsize
    line = (f"memory: 4 ranks x 6 x {args.snapshot_mb} MiB = {need / 2**30:.1f} GiB "
            f"({need_shm / 2**30:.1f} GiB of it in node memory, {shm}); available "
            f"{avail / 2**30:.1f} GiB, {shm_free / 2**30:.1f} GiB free in {shm}")
    if need > 0.7 * avail or need_shm > 0.8 * shm_free:
        raise SystemExit(line + ": does not fit with room; a smaller --snapshot-mb")
    return line


def standin_report(args: argparse.Namespace, gathered: list[list[dict]]) -> None:
    cores = os.cpu_count() or 1
    every = args.snapshot_every
    print("GPU-node stand-in (--gpu-standin): each step's forward/backward is "
          "time.sleep(step_s), a STAND-IN for accelerator time that leaves the host CPU "
          "idle as on a GPU node -- NOT a GPU measurement (no device; snapshot() copies "
          "host to host here, device to host on a GPU node)")
    which = ("the full gradient" if args.allreduce_mb == "full" else
             f"a fixed gradient, not the full one: {args.snapshot_mb / 2:g} MiB")
    print(f"  real: {args.snapshot_mb} MiB snapshot per rank ({args.tensors} float32 "
          f"tensors of weights + {args.tensors} of momentum), every {every} step(s); gloo "
          f"all_reduce of {allreduce_bytes(args) / 2**20:g} MiB a step ({which}); "
          f"4 ranks on 2 emulated nodes sharing {cores} cores (a GPU node has many a rank); "
          f"{args.rounds} rounds of {args.block} steps of each mode per step time")
    print(f"target's bandwidth: {implied_bandwidth(256, 1.0)}")
    holds_at = []
    for i, step_s in enumerate(args.step_s):
        ranks = [g[i] for g in gathered]
        slow = {m: [max(r["blocks"][m][k] for r in ranks) for k in range(args.rounds)]
                for m in MODES}
        drained = {m: [max(r["blocks"][m][k] + r["drain"][m][k] / args.block for r in ranks)
                       for k in range(args.rounds)] for m in MODES}
        med = {m: statistics.median(v) for m, v in slow.items()}
        ratio = {o: statistics.median(p / b for p, b in zip(slow["peers"], slow[o]))
                 for o in ("snapshot", "none")}
        ratio_drain = statistics.median(p / b for p, b in zip(drained["peers"],
                                                             drained["snapshot"]))
        stall = {m: statistics.median([s for r in ranks for s in r["stalls"][m]] or [0.0])
                 for m in MODES}
        stall_max = {m: max([s for r in ranks for s in r["stalls"][m]] or [0.0])
                     for m in MODES}
        reduce = {m: statistics.median(s for r in ranks for s in r["allreduce"][m])
                  for m in MODES}
        # the copy's CPU a snapshot: each rank's median over rounds, the mean over ranks
        copy_cpu = statistics.mean(
            statistics.median(p - s for p, s in zip(r["cpu"]["peers"], r["cpu"]["snapshot"]))
            for r in ranks) * every
        thread_cpu = statistics.mean(statistics.median(r["thread_cpu"]["peers"])
                                     for r in ranks) * every
        latency = [x for r in ranks for x in r["latency"]]
        puts, sent = sum(r["puts"] for r in ranks), sum(r["sent"] for r in ranks)
        drain = statistics.median(d for r in ranks for d in r["drain"]["peers"])
        holds, whole = ratio["snapshot"] <= 1.05, sent == puts
        if holds:
            holds_at.append((step_s, whole))
        print(f"\nstep {step_s:g} s (stand-in), slowest rank, median over rounds:")
        for k in range(args.rounds):
            print(f"  round {k + 1}: " + ", ".join(f"{m} {slow[m][k] * 1000:.1f} ms"
                                                   for m in MODES))
        for m in MODES:
            print(f"  {m:9s} {med[m] * 1000:8.1f} ms a step   blocked in snapshot() "
                  f"{stall[m] * 1000:6.1f} ms median, {stall_max[m] * 1000:6.1f} ms max   "
                  f"all_reduce {reduce[m] * 1000:5.1f} ms median")
        print(f"  peers / snapshot = {ratio['snapshot']:.3f}x (target <= 1.05; "
              f"{ratio_drain:.3f}x counting each block's last copy's drain, median "
              f"{drain * 1000:.0f} ms, in full); peers / none = {ratio['none']:.3f}x")
        lat = (f"median {statistics.median(latency) * 1000:.0f} ms, max "
               f"{max(latency) * 1000:.0f} ms" if latency else "none sent whole")
        print(f"  copy: CPU {copy_cpu * 1000:.0f} ms a snapshot a rank (process CPU, peers "
              f"less snapshot: checksums, send, the ward's receive; peer threads alone "
              f"{thread_cpu * 1000:.0f} ms); 4 ranks' copies use "
              f"{4 * copy_cpu / every / step_s / cores:.0%} of the {cores} cores; latency "
              f"(snapshot() return -> counted sent whole) {lat}; sent whole {sent} of "
              f"{puts}")
        print(f"  implied: {implied_bandwidth(args.snapshot_mb, step_s, every)}")
        print("PEER_STANDIN " + json.dumps({
            "mode": "gpu-standin (sleep stands in for accelerator time; not a GPU)",
            "step_s": step_s, "snapshot_mib": args.snapshot_mb, "snapshot_every": every,
            "allreduce_mib": allreduce_bytes(args) / 2**20, "ranks": 4, "nodes": 2,
            "cores": cores, "rounds": args.rounds, "block": args.block,
            "step_ms_slowest": {m: round(med[m] * 1000, 1) for m in MODES},
            "ratio_peers_snapshot": round(ratio["snapshot"], 4),
            "ratio_peers_none": round(ratio["none"], 4),
            "ratio_peers_snapshot_drain_counted": round(ratio_drain, 4),
            "snapshot_blocked_ms_median": {m: round(stall[m] * 1000, 1) for m in MODES},
            "snapshot_blocked_ms_max": {m: round(stall_max[m] * 1000, 1) for m in MODES},
            "allreduce_ms_median": {m: round(reduce[m] * 1000, 1) for m in MODES},
            "copy_cpu_ms_per_snapshot": round(copy_cpu * 1000, 1),
            "copy_thread_cpu_ms_per_snapshot": round(thread_cpu * 1000, 1),
            "copy_latency_ms_median": round(statistics.median(latency) * 1000, 1)
            if latency else None,
            "copy_latency_ms_max": round(max(latency) * 1000, 1) if latency else None,
            "copies_sent_whole": [sent, puts],
            "implied_mib_s_per_rank": round(args.snapshot_mb / step_s / every, 1),
            "holds": holds, "every_copy_whole": whole}))

    def smallest(ok: set) -> str:
        """The smallest step time swept from which every longer one holds too."""
        found = None
        for s in sorted(args.step_s, reverse=True):
            if s not in ok:
                break
            found = s
        return f"{found:g} s" if found is not None else "none"

    at = {s for s, _ in holds_at}
    whole_at = {s for s, w in holds_at if w}
    print(f"\npeers / snapshot <= 1.05x (slowest rank) at "
          f"{', '.join(f'{s:g} s' for s in sorted(at)) or 'none'} of the step times swept "
          f"(smallest from which it holds: {smallest(at)}); with every copy sent whole too: "
          f"{', '.join(f'{s:g} s' for s in sorted(whole_at)) or 'none'} (smallest: "
          f"{smallest(whole_at)})")


def one_run(args: argparse.Namespace, base: Path, port: int,
            extra: tuple[str, ...] = ()) -> dict:
    work = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    out = work / "times.json"
    for mode in ("snapshot", "peers"):
        (work / "ckpt" / mode).mkdir(parents=True)
    env = {**os.environ, "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "HPCTRAIN_RUN_ID": "bench",
           "HPCTRAIN_RESTART_COUNT": "0", "HPCTRAIN_LOCAL_DIR": str(work / "shm"),
           "HPCTRAIN_PROGRESS_TOKEN": "bench-token"}
    argv = [sys.executable, __file__, "--worker", "--dir", str(work / "ckpt"),
            "--out", str(out), "--params", str(args.params), "--rounds", str(args.rounds),
            "--block", str(args.block), "--warmup", str(args.warmup),
            "--batch", str(args.batch), *extra]
    procs = [subprocess.Popen(argv, env={**env, "RANK": str(r),
                                         "SLURMD_NODENAME": "n1" if r < 2 else "n2"})
             for r in range(4)]
    try:
        if any(p.wait(timeout=3600) for p in procs):
            raise SystemExit("a rank failed")
    finally:
        for p in procs:               # the others, when one failed (or this was stopped)
            if p.poll() is None:
                p.kill()
                p.wait()
    return json.loads(out.read_text())


def parse_count(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6}.get(text[-1].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=parse_count, default=parse_count("4M"))
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds (default 12; with --gpu-standin 3)")
    ap.add_argument("--block", type=int, default=None,
                    help="steps of one mode in a row (default 8; with --gpu-standin 4)")
    ap.add_argument("--batch", type=int, default=512,
                    help="samples per rank and step: the step's work against the state's "
                         "size (a transformer step does far more per parameter than this)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="steps of each mode first, untimed (default 3; with --gpu-standin 3, "
                         "at the longest --step-s)")
    standin = ap.add_argument_group(
        "GPU-node stand-in", "--gpu-standin: each step's compute is time.sleep(step_s), a "
        "stand-in for accelerator time that leaves the host CPU idle (not a GPU "
        "measurement); the state, the snapshots, their peer copies and the gloo all-reduce "
        "are real")
    standin.add_argument("--gpu-standin", action="store_true",
                         help="the GPU-node stand-in instead of the all-CPU worst case")
    standin.add_argument("--snapshot-mb", type=int, default=256,
                         help="MiB of state a rank snapshots (default 256: 4 ranks need "
                              "about 20x this in memory, 5 GiB; checked before starting)")
    standin.add_argument("--step-s", type=lambda t: [float(x) for x in t.split(",")],
                         default=[0.25, 0.5, 1.0, 2.0],
                         help="the stand-in's compute time a step, seconds, comma-separated "
                              "(swept in this order; default 0.25,0.5,1,2)")
    standin.add_argument("--allreduce-mb", default="4",
                         help="MiB of gradient all-reduced a step, or 'full' (the weights: "
                              "half the snapshot); default 4")
    standin.add_argument("--snapshot-every", type=int, default=1,
                         help="steps between snapshots (default 1)")
    standin.add_argument("--tensors", type=int, default=4,
                         help="float32 tensors of weights (and as many of momentum)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name, cpu, gpu in (("rounds", 12, 3), ("block", 8, 4), ("warmup", 3, 3)):
        if getattr(args, name) is None:
            setattr(args, name, gpu if args.gpu_standin else cpu)
    if args.worker:
        return worker(args)
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.ckpt import free_port

    if args.gpu_standin:
        # node memory in memory, as a node's is (/dev/shm; $TMPDIR may be a disk)
        shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
        print(memory_check(args, shm), flush=True)
        extra = ("--gpu-standin", "--snapshot-mb", str(args.snapshot_mb),
                 "--step-s", ",".join(map(str, args.step_s)),
                 "--allreduce-mb", str(args.allreduce_mb),
                 "--snapshot-every", str(args.snapshot_every), "--tensors", str(args.tensors))
        with tempfile.TemporaryDirectory(prefix="peer-bench-", dir=shm) as tmp:
            gathered = one_run(args, Path(tmp), free_port(), extra)
        return standin_report(args, gathered)

    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        result = one_run(args, Path(tmp), free_port())
    print("all-CPU worst case (training fills the cores): each step's compute is the "
          "MLP's forward/backward on the CPU, so the copies' CPU is taken from the training")
    blocks = result["blocks"]
    for r in range(args.rounds):
        print(f"round {r + 1}: " + ", ".join(f"{m} {blocks[m][r] * 1000:.1f} ms"
                                             for m in MODES))
    med = {m: statistics.median(v) for m, v in blocks.items()}
    ratio = {o: statistics.median(p / b for p, b in zip(blocks["peers"], blocks[o]))
             for o in ("snapshot", "none")}
    print(f"{args.params / 1e6:.1f}M parameters ({args.params * 8 / 1e6:.0f} MB snapshot per "
          f"rank), batch {args.batch}, 4 ranks on 2 nodes, {args.rounds} rounds of "
          f"{args.block} steps of each, median over rounds of a block's mean step:")
    for m in MODES:
        print(f"  {m:9s} {med[m] * 1000:8.1f} ms   snapshot() itself "
              f"{result['stalls'][m] * 1000:6.1f} ms")
    print(f"peers / snapshot = {ratio['snapshot']:.3f}x (median of the rounds' ratios; "
          f"target <= 1.05); peers / none = {ratio['none']:.3f}x")
    # where four ranks keep the cores busy, the CPU the copies take is a step's, unless
    # it fits in the training's idle moments
    more = result["cpu"]["peers"] - result["cpu"]["snapshot"]
    cores = os.cpu_count() or 1
    print(f"CPU a step, rank 0's process (every thread): {result['cpu']['snapshot'] * 1000:.1f}"
          f" ms with the snapshot alone, {result['cpu']['peers'] * 1000:.1f} ms with peer "
          f"copies (+{more * 1000:.1f} ms: its checksums, send and its ward's receive); "
          f"4 ranks' training fills {4 * result['cpu']['snapshot'] / cores / med['snapshot']:.0%}"
          f" of {cores} cores: {1 + 4 * more / cores / med['snapshot']:.3f}x if none of that "
          "fit in idle moments")
    sent, puts = result["sent"]
    print(f"rank 0's snapshots that reached its partner whole: {sent} of {puts} (a send "
          "still on its way when the next snapshot comes is cut short: the training never "
          "waits for the network)")


if __name__ == "__main__":
    main()
