"""The checkpoint's save plan and manifest at 64 to 4,096 ranks, simulated in one process
(no Slurm, no process per rank), through hpctrain's own planning and manifest code.

    .venv/bin/python benchmarks/ckpt_scale_sim.py                  # 64, 256, 1024, 4096 ranks
    .venv/bin/python benchmarks/ckpt_scale_sim.py --quick          # 64, 256, 1024
    .venv/bin/python benchmarks/ckpt_scale_sim.py --ranks 64,4096 --json /tmp/sim.json

The state is a GPT-3-175B-like model (96 layers, d_model 12288, vocab 51200) laid out as
examples/train_gpt.py lays it out: ranks ordered tp fastest, then dp, then pp; q/k/v/fc1
column-parallel and o/fc2 row-parallel DTensors over the tp mesh (their row-parallel biases
Replicate), the embeddings and head vocab-parallel, the layer norms plain tensors; AdamW's
state per parameter (exp_avg, exp_avg_sq as the parameter; step, a plain scalar), its
param_groups and the data position as extras, and each rank's own RNG state (a plain
tensor that differs by rank). tp and pp are fixed (8 x 8 by default) and dp grows with the
ranks: at 4,096 ranks tp=8, pp=8, dp=64; 769-781 tensors per rank (192-195 parameters,
each with its three optimizer tensors, and the RNG state).

Tensors are metadata where the code allows: a DTensor's global shape is real and its local
tensor one element (the plan and the manifest use only the box and its byte count); plain
tensors (layer norms, optimizer steps, RNG states) are real, since their bytes are
fingerprinted. Data files are sparse files of the recorded size: no tensor bytes are written.

What runs for real, per simulated rank: ``tree.flatten`` (the DTensor branch under torch's
own *fake* process-group backend, ``torch.testing._internal.distributed.fake_pg``, which
gives each rank its tp coordinate without communicating), ``writer.rank_writer`` (the
provisional plan: ``replicas.plan_writes`` on every rank's all-gathered sizes,
``cpus_per_rank``), ``writer.fingerprints`` and ``RankSave._prints`` (the second
all_gather's contribution), ``replicas.settle`` and ``replicas.differing`` (the final plan),
``RankSave._records`` (the manifest records and the extras file); on rank 0
``CheckpointManager._persist`` and ``_commit`` (``commit.manifest_of``, ``Manifest.dumps``,
``commit.publish``, ``catalog.prune``); then ``reader.read_manifest`` (parse + validate) and
``StepReader.check_sizes``, which every rank runs again at load (``loader.load_step``).

What does not run: torch.distributed's collectives (``comm.Comm`` needs a process group;
:class:`FakeCollective` stands in for it, pickling and unpickling each contribution as
torch's ``*_object`` collectives do; the network is not modelled, the bytes it would carry
are reported); ``RankSave._write_first`` and the rest of ``RankSave.write`` (the data I/O):
their contribution to the fingerprint all_gather is made of the same functions (the block
checksum of a chunk written first is by construction its ``fingerprints`` value), their
blocks are built from the chunks' byte counts, with a stand-in checksum for DTensor shards
(whose bytes do not exist here). Every rank computes the same plan from the same gathered
lists: it is computed (and timed) on ``--samples`` ranks and served from memory to the rest.

Figures per rank count: plan time per rank (and for all ranks: that times the ranks), the
collectives' bytes and (un)pickling time, the manifest's size and entries, rank 0's build,
serialization, commit and read/verify times; then how each grows (fitted exponent of the
rank count, and the one between the last two). ``--json FILE`` writes them all.
Times are this process's CPU time (the machine is shared; a rank's part is single-threaded),
taken with the garbage collector off: this process holds every simulated rank's objects,
which no real rank's collector would walk.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import pickle
import resource
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the real code each simulated save runs, and what stands in for what it cannot run here
DRIVES = ["tree.flatten", "writer.rank_writer", "writer.node_cpus (a simulated host per rank)",
          "writer.cpus_per_rank", "replicas.plan_writes", "writer.fingerprints",
          "writer.extras_fingerprints", "RankSave._prints", "replicas.settle",
          "replicas.differing", "RankSave._records", "fileio.write_segments",
          "CheckpointManager._persist", "CheckpointManager._commit", "commit.manifest_of",
          "Manifest.dumps", "commit.publish", "storage.apply_modes", "catalog.prune",
          "reader.read_manifest", "manifest.parse", "StepReader.check_sizes"]
STANDS_IN = {"comm.Comm (torch.distributed gloo group)": "FakeCollective / FakeComm",
             "DeviceMesh's process group": "torch's fake backend (fake_pg), one tp rank at a time",
             "RankSave._write_first and the data I/O of RankSave.write":
                 "blocks from the chunks' byte counts; sparse data files; stand-in sums for "
                 "DTensor shards"}
GPUS_PER_NODE = 8    # simulated ranks per host (what writer.node_cpus reports for each)
CPUS_PER_RANK = 12   # each rank's CPU affinity: a 96-core node with 8 GPUs
FULL_RANKS = (64, 256, 1024, 4096)
# Figures are this process's CPU time (user + system): a simulated rank's work is
# single-threaded, and on a shared machine wall time mostly measures the neighbours.
clock = time.process_time
# tmpfs when there is one: thousands of small files and sparse ones; the disk's fsyncs and
# unlinks would only add noise (the figures are CPU time anyway)
DEFAULT_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
QUICK_RANKS = (64, 256, 1024)


# -- the state ------------------------------------------------------------------------
@dataclass(frozen=True)
class Model:
    """A GPT's shape (defaults: GPT-3 175B)."""

    layers: int = 96
    d_model: int = 12288
    vocab: int = 51200
    seq: int = 2048


@dataclass(frozen=True)
class Layout:
    """tp x dp x pp ranks, ordered tp fastest, then dp, then pp (examples/train_gpt.py)."""

    tp: int
    pp: int
    dp: int

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, p: int, d: int, t: int) -> int:
        return t + self.tp * (d + self.dp * p)


def layout_for(world: int, tp: int, pp: int) -> Layout:
    if world % (tp * pp):
        raise SystemExit(f"{world} ranks do not split into tp={tp} x pp={pp} x dp")
    return Layout(tp, pp, world // (tp * pp))


def stage_params(model: Model, p: int, pp: int) -> list[tuple[str, tuple, str]]:
    """(name, global shape, placement) of pipeline stage ``p``'s parameters; placement
    "S0"/"S1" (a DTensor sharded on dim 0/1 over tp), "R" (a replicated DTensor) or
    "plain" (a plain tensor)."""
    if model.layers % pp:
        raise SystemExit(f"{model.layers} layers do not split into pp={pp} stages")
    d, f = model.d_model, 4 * model.d_model
    out: list[tuple[str, tuple, str]] = []
    if p == 0:
        out += [("tok_emb.weight", (model.vocab, d), "S0"),
                ("pos_emb.weight", (model.seq, d), "S1")]
    per = model.layers // pp
    for i in range(p * per, (p + 1) * per):
        ln = [(f"layers.{i}.{n}.{w}", (d,), "plain") for n in ("ln1", "ln2")
              for w in ("weight", "bias")]
        out += ln[:2]
        for proj in ("q", "k", "v"):
            out += [(f"layers.{i}.attn.{proj}.weight", (d, d), "S0"),
                    (f"layers.{i}.attn.{proj}.bias", (d,), "S0")]
        out += [(f"layers.{i}.attn.o.weight", (d, d), "S1"), (f"layers.{i}.attn.o.bias", (d,), "R")]
        out += ln[2:]
        out += [(f"layers.{i}.mlp.fc1.weight", (f, d), "S0"),
                (f"layers.{i}.mlp.fc1.bias", (f,), "S0"),
                (f"layers.{i}.mlp.fc2.weight", (d, f), "S1"),
                (f"layers.{i}.mlp.fc2.bias", (d,), "R")]
    if p == pp - 1:
        out += [("norm.weight", (d,), "plain"), ("norm.bias", (d,), "plain"),
                ("head.weight", (model.vocab, d), "S0")]
    return out


class StagePlain:
    """A stage's plain tensors, made once and held by every tp and dp rank of the stage
    (replicas hold equal bytes)."""

    def __init__(self, params: list[tuple[str, tuple, str]], step: int, seed: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        self.model, self.optim = {}, {}
        for name, shape, placement in params:
            self.optim[name] = {"step": torch.tensor(float(step))}
            if placement == "plain":
                self.model[name] = torch.randn(shape, generator=gen).to(torch.bfloat16)
                self.optim[name].update(exp_avg=torch.randn(shape, generator=gen),
                                        exp_avg_sq=torch.rand(shape, generator=gen))


def stage_state(params: list[tuple[str, tuple, str]], plain: StagePlain, mesh: Any) -> dict:
    """What ``get_model_state_dict``/``get_optimizer_state_dict`` give one (stage, tp rank):
    DTensors with their real global shape over a one-element local tensor."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard

    kinds = {"S0": Shard(0), "S1": Shard(1), "R": Replicate()}

    def dtensor(shape: tuple, placement: str, dtype: torch.dtype) -> Any:
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        return DTensor.from_local(torch.empty((1,) * len(shape), dtype=dtype), mesh,
                                  [kinds[placement]], run_check=False,
                                  shape=torch.Size(shape), stride=stride)

    model, state = {}, {}
    for name, shape, placement in params:
        if placement == "plain":
            model[name], state[name] = plain.model[name], dict(plain.optim[name])
            continue
        model[name] = dtensor(shape, placement, torch.bfloat16)
        state[name] = {"exp_avg": dtensor(shape, placement, torch.float32),
                       "exp_avg_sq": dtensor(shape, placement, torch.float32),
                       "step": plain.optim[name]["step"]}
    groups = [{"lr": 6e-5, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
               "amsgrad": False, "foreach": False, "maximize": False, "capturable": False,
               "differentiable": False, "fused": None, "params": [n for n, _, _ in params]}]
    return {"model": model, "optim": {"state": state, "param_groups": groups}}


def rank_state(stage: dict, rank: int, dp_rank: int, step: int) -> dict:
    """One rank's whole state: its stage's, its own RNG state, the data position."""
    import torch

    return {**stage, "step": step,
            "rng": {"torch": torch.Generator().manual_seed(1_000 + rank).get_state()},
            "data": {"epoch": 0, "dp_rank": dp_rank, "position": step * 1024 + dp_rank}}


@contextlib.contextmanager
def fake_process_group(rank: int, world: int) -> Iterator[Any]:
    """torch's own fake backend (no communication): a one-dimensional tp mesh on which
    this process is tp rank ``rank``, so DTensors have that rank's local box."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


# -- the fake collective ------------------------------------------------------------
def unpickled_size(blobs: list[bytes], probes: int = 3) -> int:
    """About what ``blobs`` take in memory once unpickled: what tracemalloc sees a few of
    them (the first, the largest, the last) take, per pickled byte, times all the bytes."""
    import tracemalloc

    picks = list(dict.fromkeys([0, max(range(len(blobs)), key=lambda i: len(blobs[i])),
                                len(blobs) - 1]))[:probes]
    took = 0
    for i in picks:
        tracemalloc.start()
        obj = pickle.loads(blobs[i])
        took += tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del obj
    return int(took / sum(len(blobs[i]) for i in picks) * sum(len(b) for b in blobs))


class AtCollective(Exception):
    """A simulated rank reached a collective whose other contributions are not all in."""


class FakeCollective:
    """FAKE collective: a recorded-behaviour stand-in for one ``all_gather_object`` or
    ``gather_object`` of the checkpoint's gloo group (:class:`hpctrain.checkpoint.comm.Comm`).

    The simulated ranks run one after another in this process, so none can wait in a
    collective for the others. Each contribution is pickled as torch's ``*_object``
    collectives pickle it and held in memory; a rank that reaches the collective before
    every contribution is in (or while ``stop`` is set: the recording pass) is stopped
    there (:class:`AtCollective`); once all are in, a rank that reaches it (its code run
    again) gets what the real collective returns: every rank's object, unpickled, in rank
    order, and its own contribution is checked to be the one recorded. The unpickling is
    done (and timed) once: every receiver of a real all_gather pays it. The network is not
    modelled; :meth:`figures` gives the bytes it would carry (torch pads every contribution
    to the largest, so each receiver gets ``world x max``).
    """

    def __init__(self, name: str, world: int) -> None:
        self.name, self.world = name, world
        self.blobs: list[bytes | None] = [None] * world
        self.pickle_s: list[float] = []
        self.unpickle_s = 0.0
        self.unpickled_bytes = 0   # what the delivered objects take in memory (about)
        self.stop = True
        self._delivered: list[Any] | None = None

    def record(self, rank: int, obj: Any) -> bytes:
        start = clock()
        blob = pickle.dumps(obj)  # what _object_to_tensor's Pickler writes
        self.pickle_s.append(clock() - start)
        if self.blobs[rank] is None:
            self.blobs[rank] = blob
        elif blob != self.blobs[rank] and pickle.loads(self.blobs[rank]) != obj:
            raise AssertionError(f"{self.name}: rank {rank} contributed something else "
                                 "when run again")
        return blob

    def exchange(self, rank: int, obj: Any) -> list[Any]:
        self.record(rank, obj)
        if self.stop or any(b is None for b in self.blobs):
            raise AtCollective(self.name)
        return self.deliver()

    def deliver(self) -> list[Any]:
        if self._delivered is None:
            missing = [r for r, b in enumerate(self.blobs) if b is None]
            if missing:
                raise AssertionError(f"{self.name}: no contribution from ranks {missing[:5]}")
            start = clock()
            self._delivered = [pickle.loads(b) for b in self.blobs]  # type: ignore[arg-type]
            self.unpickle_s = clock() - start
            self.unpickled_bytes = unpickled_size(self.blobs)  # type: ignore[arg-type]
        return self._delivered

    def release(self) -> None:
        """Drop the contributions (the figures stay)."""
        self._fig = self.figures()
        self.blobs, self._delivered = [], None

    def figures(self, gather: bool = False) -> dict[str, float]:
        if not self.blobs and hasattr(self, "_fig"):
            return self._fig
        sizes = [len(b) for b in self.blobs if b is not None]
        return {"bytes_per_rank_mean": statistics.mean(sizes),
                "bytes_per_rank_max": max(sizes), "bytes_total": sum(sizes),
                # torch pads each contribution to the largest: a receiver gets world x max
                "recv_bytes_per_receiver": self.world * max(sizes),
                "receivers": 1 if gather else self.world,
                "pickle_ms_per_rank": 1e3 * statistics.median(self.pickle_s),
                "unpickle_s_per_receiver": self.unpickle_s,
                # about (tracemalloc on a few contributions, scaled by the bytes)
                "unpickled_mb_per_receiver": self.unpickled_bytes / 1e6}


class FakeComm:
    """The interface of :class:`hpctrain.checkpoint.comm.Comm` for one simulated rank,
    its all_gather and gather served by a :class:`FakeCollective`. Only rank 0's view of
    a broadcast is simulated (its own object)."""

    active = True

    def __init__(self, rank: int, world: int, collective: FakeCollective | None = None) -> None:
        self.rank, self.world, self.collective = rank, world, collective

    def barrier(self) -> None:
        pass

    def all_gather(self, obj: Any) -> list[Any]:
        assert self.collective is not None
        return self.collective.exchange(self.rank, obj)

    def gather(self, obj: Any) -> list[Any] | None:
        assert self.collective is not None
        out = self.collective.exchange(self.rank, obj)
        return out if self.rank == 0 else None

    def broadcast(self, obj: Any) -> Any:
        assert self.rank == 0, "only rank 0's view of a broadcast is simulated"
        return obj


class patched:
    """``owner.name = value`` within a with-block. A class, not a generator: a simulated
    rank stopped at a collective (AtCollective) passes through it, and a generator's
    context manager would keep that exception, its traceback and so every frame on it
    (the whole simulation's locals) alive in a reference cycle."""

    def __init__(self, owner: Any, name: str, value: Any) -> None:
        self.owner, self.name, self.value = owner, name, value

    def __enter__(self) -> None:
        self.own = self.name in vars(self.owner)   # else inherited (a method): deleted after
        self.old = getattr(self.owner, self.name)
        setattr(self.owner, self.name, self.value)

    def __exit__(self, *exc: object) -> None:
        if self.own:
            setattr(self.owner, self.name, self.old)
        else:
            delattr(self.owner, self.name)


def simulated_host(rank: int) -> Callable[[], tuple[str, frozenset[int]]]:
    """What ``writer.node_cpus`` reports on ``rank``: its node (GPUS_PER_NODE ranks a node)
    and its CPUs (CPUS_PER_RANK of them), not this machine's."""
    first = (rank % GPUS_PER_NODE) * CPUS_PER_RANK
    host = (f"gpu{rank // GPUS_PER_NODE:05d}", frozenset(range(first, first + CPUS_PER_RANK)))
    return lambda: host


class PlanMemo:
    """``replicas.plan_writes`` computed for real on the sampled ranks and served from
    memory to the others, which would compute the same plan from the same lists."""

    def __init__(self, real: Callable) -> None:
        self.real, self.compute = real, True
        self.plan: Any = None
        self.inputs: list | None = None
        self.seconds: list[float] = []

    def __call__(self, held: list) -> Any:
        if self.compute or self.inputs is None:
            start = clock()
            plan = self.real(held)
            self.seconds.append(clock() - start)
            if self.plan is not None and plan != self.plan:
                raise AssertionError("two ranks computed different save plans")
            self.plan, self.inputs = plan, held
            return plan
        assert len(held) == len(self.inputs)
        assert all(a is b for a, b in zip(held, self.inputs, strict=True))
        return self.plan


class Probes:
    """Wall time spent in named functions while a block runs (wrapped, then restored)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}     # CPU
        self.wall: dict[str, float] = {}
        self._stack = contextlib.ExitStack()

    def wrap(self, owner: Any, name: str, label: str) -> None:
        real = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start, wall = clock(), time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + clock() - start
                self.wall[label] = self.wall.get(label, 0.0) + time.perf_counter() - wall

        self._stack.enter_context(patched(owner, name, timed))

    def __enter__(self) -> Probes:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


# -- one simulation ---------------------------------------------------------------------
@dataclass
class Sim:
    """One simulated save: its figures, and what the tests look at."""

    layout: Layout
    step: int
    figures: dict[str, Any] = field(default_factory=dict)
    chunks: list[list] = field(default_factory=list)      # per rank: tree.Chunk
    plan: Any = None                                       # provisional WritePlan
    final: Any = None                                      # settled WritePlan
    own_extras: list = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    manifest: Any = None                                   # as read back from disk
    manifest_bytes: bytes = b""
    held: list = field(default_factory=list)               # the sizes all_gather, delivered
    contributions: list = field(default_factory=list)      # what each rank put into it


def warm_imports() -> None:
    """Import what the simulation uses before it starts: a first import of torch's
    distributed modules leaves reference cycles of frames behind (caught exceptions), and
    every frame below it on the stack with them, which would hold a simulation's locals
    (every rank's state) until the garbage collector, off while it runs, comes by."""
    import torch.distributed.tensor  # noqa: F401
    import torch.distributed.tensor._utils  # noqa: F401
    from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    from torch.testing._internal.distributed import fake_pg  # noqa: F401

    from hpctrain.checkpoint import catalog, commit, manager, reader, writer  # noqa: F401


def sample_ranks(world: int, samples: int) -> list[int]:
    """Rank 0, the last rank, then ranks between: ``samples`` of them (at least one)."""
    picks = list(dict.fromkeys([0, world - 1, world // 2, world // 4, (3 * world) // 4]))
    return sorted(picks[:max(1, samples)])


def simulate(world: int, workdir: Path, *, tp: int = 8, pp: int = 8, model: Model = Model(),
             samples: int = 2, step: int = 1000, keep: bool = False,
             log: Callable[[str], None] = lambda s: None) -> Sim:
    """Simulate one sync save of ``world`` ranks into a fresh root under ``workdir``.

    The garbage collector is off meanwhile: this process holds every simulated rank's
    state, which no real rank's collector walks, so its collections would measure the
    simulation; the figures are the code's own cost (reference counting still frees)."""
    warm_imports()
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(world, workdir, tp=tp, pp=pp, model=model, samples=samples,
                         step=step, keep=keep, log=log)
    finally:
        if enabled:
            gc.enable()


def _simulate(world: int, workdir: Path, *, tp: int, pp: int, model: Model, samples: int,
              step: int, keep: bool, log: Callable[[str], None]) -> Sim:
    from hpctrain.checkpoint import catalog, commit, replicas, storage, tree, writer
    from hpctrain.checkpoint.manager import CheckpointManager
    from hpctrain.checkpoint.manifest import Manifest, step_dirname
    from hpctrain.checkpoint.reader import StepReader, read_manifest

    lay = layout_for(world, tp, pp)
    sim = Sim(lay, step, sampled=sample_ranks(world, samples))
    fig: dict[str, Any] = {"ranks": world, "tp": lay.tp, "pp": lay.pp, "dp": lay.dp}
    wall0 = time.perf_counter()

    # 1. every rank's state, flattened (tree.flatten) and run to rank_writer's all_gather
    sizes = FakeCollective("sizes all_gather", world)
    chunks: list[list] = [[] for _ in range(world)]
    extras: list[dict] = [{} for _ in range(world)]
    flatten_s, local_s = [0.0] * world, [0.0] * world
    params = [stage_params(model, p, pp) for p in range(pp)]
    plain = [StagePlain(params[p], step, seed=p) for p in range(pp)]
    for t in range(tp):
        with fake_process_group(t, tp) as mesh:
            tree._local_box.cache_clear()  # its key (the mesh) is equal across tp ranks here
            for p in range(pp):
                stage = stage_state(params[p], plain[p], mesh)
                for d in range(lay.dp):
                    r = lay.rank(p, d, t)
                    state = rank_state(stage, r, d, step)
                    start = clock()
                    chunks[r], extras[r] = tree.flatten(state)
                    flatten_s[r] = clock() - start
                    with patched(writer, "node_cpus", simulated_host(r)):
                        start = clock()
                        try:
                            writer.rank_writer(FakeComm(r, world, sizes), chunks[r], extras[r])
                        except AtCollective:
                            pass
                        else:
                            raise AssertionError("rank_writer passed its all_gather")
                        local_s[r] = clock() - start
                del stage
    log(f"  {world} ranks: flattened, sizes recorded ({time.perf_counter() - wall0:.1f} s)")

    # 2. the sizes all_gather delivered; rank_writer run again on every rank: the
    # provisional plan computed on the sampled ranks, served to the others
    sizes.stop = False
    sizes.deliver()
    memo = PlanMemo(replicas.plan_writes)
    saves: list[Any] = [None] * world
    writer_s: dict[int, float] = {}
    with patched(replicas, "plan_writes", memo):
        for r in sim.sampled + [r for r in range(world) if r not in sim.sampled]:
            memo.compute = r in sim.sampled
            with patched(writer, "node_cpus", simulated_host(r)):
                start = clock()
                saves[r] = writer.rank_writer(FakeComm(r, world, sizes), chunks[r],
                                              extras[r]).__self__
                if r in sim.sampled:
                    writer_s[r] = clock() - start
    plan = sim.plan = memo.plan
    held_counts = [len(held) for _, held in sizes.deliver()]
    if world <= 64:  # for the tests: what was gathered, and what each rank sent
        sim.held = [held for _, held in sizes.deliver()]
        sim.contributions = [pickle.loads(b) for b in sizes.blobs]  # type: ignore[arg-type]
    sizes.release()
    log(f"  {world} ranks: provisional plan ({time.perf_counter() - wall0:.1f} s)")

    # 3. the fingerprints all_gather (RankSave.write's), then settle and differing
    prints = FakeCollective("fingerprints all_gather", world)
    prints_s = [0.0] * world
    for r in range(world):
        save = saves[r]
        start = clock()
        first = [c for c in save.payload.chunks if plan.writes(r, c.key())]
        rest = [c for c in save.payload.chunks if not plan.writes(r, c.key())]
        others, efps = save._prints(rest)
        local = (writer.fingerprints(first) + others, efps)
        prints_s[r] = clock() - start
        try:
            prints.exchange(r, local)
        except AtCollective:
            pass
    prints.stop = False
    del memo.inputs
    gathered = prints.deliver()
    settle_s, differing_s = [], []
    for _rank in sim.sampled:   # each computes it: timed on each
        start = clock()
        final = replicas.settle(plan, [held for held, _ in gathered])
        settle_s.append(clock() - start)
        start = clock()
        own = replicas.differing([e for _, e in gathered])
        differing_s.append(clock() - start)
        if sim.final is not None and (final != sim.final or own != sim.own_extras):
            raise AssertionError("two ranks settled on different plans")
        sim.final, sim.own_extras = final, own
    final, own_extras = sim.final, sim.own_extras
    # the plain chunks' checksums (a written block's sum is its fingerprint)
    crcs = [{key: crc for key, _n, crc in held if crc is not None} for held, _ in gathered]
    prints.release()
    del gathered
    log(f"  {world} ranks: settled ({time.perf_counter() - wall0:.1f} s)")

    # 4. every rank's records (RankSave._records), gathered to rank 0, which commits
    workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"ckpt-sim-{world}-", dir=workdir))
    records = FakeCollective("records gather", world)
    records_s = [0.0] * world
    written_entries = [0] * world

    def write_all(tmp: Path) -> Any:
        """Every rank's write into ``tmp``: ranks 1.. contribute to rank 0's gather."""
        mine = None
        for r in range(world):
            save = saves[r]
            start = clock()
            first = [c for c in save.payload.chunks if plan.writes(r, c.key())]
            more = [c for c in save.payload.chunks if final.writes(r, c.key())
                    and not plan.writes(r, c.key())]
            written = [dataclasses.replace(c, rank=r) if c.key() in final.per_rank else c
                       for c in first + more]
            blocks, off = [], 0
            for c in written:  # SegmentFile.write's blocks; shards' sums stand-ins
                crc = crcs[r].get(c.key())
                if crc is None:
                    crc = zlib.crc32(repr((c.key(), r)).encode())
                blocks.append((off, c.nbytes, crc))
                off += c.nbytes
            data_name = f"rank{r:05d}.bin"
            with open(tmp / data_name, "wb") as f:
                f.truncate(off)  # sparse: the recorded size, no bytes
            rec = save._records(tmp, data_name, off, written, blocks, own_extras)
            records_s[r] = clock() - start
            written_entries[r] = len(rec.tensors)
            if r == 0:
                mine = rec
            else:
                records.record(r, ("ok", rec))
        return mine

    records.stop = False
    mgr = CheckpointManager(root, keep_last=3)
    try:
        mgr.comm = FakeComm(0, world, records)
        with Probes() as probes:
            probes.wrap(commit, "manifest_of", "manifest_of")
            probes.wrap(Manifest, "dumps", "dumps")
            probes.wrap(commit, "publish", "publish")
            probes.wrap(storage, "apply_modes", "apply_modes")
            probes.wrap(catalog, "prune", "prune")
            probes.wrap(mgr, "_commit", "commit")
            start = clock()
            mgr._persist(step, write_all, {"kind": "torch"})
            persist_s = clock() - start
    finally:
        mgr.close()
    # rank 0's own part of _persist: all but the other ranks' simulated writes and sends
    persist_rank0_s = persist_s - sum(records_s[1:]) - sum(records.pickle_s[:-1])
    rec_fig = records.figures(gather=True)
    records.release()
    log(f"  {world} ranks: committed ({time.perf_counter() - wall0:.1f} s)")

    # 5. read back and check, as latest_step/prune (rank 0) and every loading rank do
    step_dir = root / step_dirname(step)
    start = clock()
    sim.manifest = read_manifest(step_dir)
    read_s = clock() - start
    start = clock()
    problem = StepReader(step_dir, sim.manifest).check_sizes()
    check_s = clock() - start
    if problem:
        raise AssertionError(problem)
    sim.manifest_bytes = (step_dir / "manifest.json").read_bytes()
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    sim.chunks = chunks if world <= 64 else []

    # the figures
    man = sim.manifest
    med = statistics.median
    sampled_writer = [writer_s[r] for r in sim.sampled]
    per_rank_plan_ms = 1e3 * (med(flatten_s) + med(sampled_writer) + med(prints_s)
                              + med(settle_s) + med(differing_s))
    fig.update({
        "tensors_per_rank": statistics.mean(held_counts),
        "held_items_total": sum(held_counts),
        "distinct_keys": len(plan.owner) + len(plan.per_rank),
        "per_rank_keys": len(final.per_rank),
        "sampled_ranks": sim.sampled,
        "plan": {
            "flatten_ms": 1e3 * med(flatten_s),
            "rank_writer_to_collective_ms": 1e3 * med(local_s),
            "rank_writer_ms": 1e3 * med(sampled_writer),
            "plan_writes_ms": 1e3 * med(memo.seconds),
            "fingerprints_ms": 1e3 * med(prints_s),
            "settle_ms": 1e3 * med(settle_s),
            "differing_ms": 1e3 * med(differing_s),
            "per_rank_ms": per_rank_plan_ms,
            "all_ranks_cpu_s": per_rank_plan_ms * world / 1e3,
        },
        "collectives": {"sizes_all_gather": sizes.figures(),
                        "fingerprints_all_gather": prints.figures(),
                        "records_gather": rec_fig},
        "manifest": {
            "bytes": len(sim.manifest_bytes),
            "files": len(man.files), "tensor_entries": len(man.tensors),
            "per_rank_tensor_entries": sum(1 for t in man.tensors if t.rank is not None),
            "extras_entries": len(man.extras),
            "records_ms_per_rank": 1e3 * med(records_s),
            "manifest_of_s": probes.seconds.get("manifest_of", 0.0),
            "dumps_s": probes.seconds.get("dumps", 0.0),
            "publish_s": probes.seconds.get("publish", 0.0),
            "apply_modes_s": probes.seconds.get("apply_modes", 0.0),
            "prune_s": probes.seconds.get("prune", 0.0),
            "commit_s": probes.seconds.get("commit", 0.0),
            "commit_wall_s": probes.wall.get("commit", 0.0),
            "publish_wall_s": probes.wall.get("publish", 0.0),
            "persist_rank0_s": persist_rank0_s,
            "read_parse_s": read_s,
            "check_sizes_s": check_s,
        },
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "sim_wall_s": time.perf_counter() - wall0,
    })
    sim.figures = fig
    return sim


# -- growth and output ----------------------------------------------------------------
METRICS: list[tuple[str, str, str]] = [
    # (label, path in the figures, what it is per)
    ("manifest bytes", "manifest.bytes", "rank 0"),
    ("manifest tensor entries", "manifest.tensor_entries", "rank 0"),
    ("manifest files", "manifest.files", "rank 0"),
    ("plan: flatten", "plan.flatten_ms", "per rank"),
    ("plan: rank_writer (provisional plan)", "plan.rank_writer_ms", "per rank"),
    ("plan: replicas.plan_writes", "plan.plan_writes_ms", "per rank"),
    ("plan: fingerprints", "plan.fingerprints_ms", "per rank"),
    ("plan: replicas.settle", "plan.settle_ms", "per rank"),
    ("plan: total", "plan.per_rank_ms", "per rank"),
    ("plan: total, all ranks (CPU)", "plan.all_ranks_cpu_s", "all ranks"),
    ("sizes all_gather: bytes received", "collectives.sizes_all_gather.recv_bytes_per_receiver",
     "per rank"),
    ("sizes all_gather: unpickle", "collectives.sizes_all_gather.unpickle_s_per_receiver",
     "per rank"),
    ("fingerprints all_gather: bytes received",
     "collectives.fingerprints_all_gather.recv_bytes_per_receiver", "per rank"),
    ("fingerprints all_gather: unpickle",
     "collectives.fingerprints_all_gather.unpickle_s_per_receiver", "per rank"),
    ("records gather: bytes at rank 0", "collectives.records_gather.recv_bytes_per_receiver",
     "rank 0"),
    ("records gather: unpickle", "collectives.records_gather.unpickle_s_per_receiver", "rank 0"),
    ("records (RankSave._records)", "manifest.records_ms_per_rank", "per rank"),
    ("commit.manifest_of", "manifest.manifest_of_s", "rank 0"),
    ("Manifest.dumps", "manifest.dumps_s", "rank 0"),
    ("commit.publish", "manifest.publish_s", "rank 0"),
    ("catalog.prune", "manifest.prune_s", "rank 0"),
    ("CheckpointManager._commit", "manifest.commit_s", "rank 0"),
    ("read_manifest (parse+validate)", "manifest.read_parse_s", "every rank at load"),
    ("StepReader.check_sizes", "manifest.check_sizes_s", "every rank at load"),
]


def get(fig: dict, path: str) -> float:
    for part in path.split("."):
        fig = fig[part]
    return float(fig)  # type: ignore[arg-type]


def exponent(xs: list[float], ys: list[float]) -> float | None:
    """b of y ~ a * x^b, least squares in log-log (None when a value is not positive)."""
    if len(xs) < 2 or min(ys) <= 0:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / den


def verdict(b: float | None) -> str:
    if b is None:
        return "-"
    if b < 0.2:
        return "flat"
    if b < 0.8:
        return "sublinear"
    if b <= 1.2:
        return "linear"
    return "SUPERLINEAR"


def growth(results: list[dict]) -> list[dict]:
    """Per metric: the exponent fitted over every rank count, and the one between the last
    two (the trend once the parts fixed by the model no longer dominate), which names the
    growth."""
    ranks = [float(r["ranks"]) for r in results]
    out = []
    for label, path, per in METRICS:
        ys = [get(r, path) for r in results]
        last = ys[-1] / ys[-2] if len(ys) > 1 and ys[-2] > 0 else None
        local = (math.log(last) / math.log(ranks[-1] / ranks[-2])
                 if last and ranks[-1] != ranks[-2] else None)
        out.append({"metric": label, "path": path, "per": per, "values": ys,
                    "exponent": exponent(ranks, ys), "last_exponent": local,
                    "last_ratio": last,
                    "ranks_ratio": ranks[-1] / ranks[-2] if len(ranks) > 1 else None,
                    "growth": verdict(local)})
    return out


def mb(n: float) -> str:
    return f"{n / 1e6:.2f}" if n < 1e8 else f"{n / 1e6:.0f}"


def print_tables(results: list[dict]) -> None:
    print("\nSave plan, per rank (CPU ms; median over the ranks, plan_writes and settle over the "
          "sampled ones)")
    print(f"{'ranks':>6} {'tp x pp x dp':>13} {'tensors':>8} {'flatten':>8} {'writer':>8} "
          f"{'plan_wr':>8} {'fprints':>8} {'settle':>8} {'total':>8} {'all ranks CPU s':>16}")
    for r in results:
        p = r["plan"]
        print(f"{r['ranks']:>6} {r['tp']:>4} x {r['pp']} x {r['dp']:<3} "
              f"{r['tensors_per_rank']:>8.0f} {p['flatten_ms']:>8.2f} {p['rank_writer_ms']:>8.1f} "
              f"{p['plan_writes_ms']:>8.1f} {p['fingerprints_ms']:>8.2f} {p['settle_ms']:>8.1f} "
              f"{p['per_rank_ms']:>8.1f} {p['all_ranks_cpu_s']:>16.1f}")
    print("\nCollectives (fake: pickled as torch's *_object ones; network not modelled). MB: one "
          "contribution (the largest),")
    print("what each receiver gets (world x the largest), what it unpickles into (about); "
          "s: CPU unpickling it all")
    print(f"{'ranks':>6} | {'sizes all_gather':^29} | {'fingerprints all_gather':^29} | "
          f"{'records gather (rank 0)':^29}")
    print(f"{'':>6} |" + " |".join([f" {'MB/rank':>7} {'MB recv':>7} {'MB obj':>6} {'s':>5}"] * 3))
    for r in results:
        cells = []
        for name in ("sizes_all_gather", "fingerprints_all_gather", "records_gather"):
            c = r["collectives"][name]
            cells.append(f" {mb(c['bytes_per_rank_max']):>7} "
                         f"{mb(c['recv_bytes_per_receiver']):>7} "
                         f"{c['unpickled_mb_per_receiver']:>6.0f} "
                         f"{c['unpickle_s_per_receiver']:>5.2f}")
        print(f"{r['ranks']:>6} |" + " |".join(cells))
    print("\nManifest: entries, size; CPU s on rank 0 (records: ms per rank; read and stat:")
    print("rank 0 at every save's prune, and every rank at a load; commit wall: with fsyncs)")
    print(f"{'ranks':>6} {'files':>6} {'tensors':>8} {'per-rank':>8} {'MB':>7} {'records':>8} "
          f"{'build':>6} {'dumps':>6} {'publish':>7} {'prune':>6} {'commit':>7} {'wall':>6} "
          f"{'read':>6} {'stat':>6}")
    for r in results:
        m = r["manifest"]
        print(f"{r['ranks']:>6} {m['files']:>6} {m['tensor_entries']:>8} "
              f"{m['per_rank_tensor_entries']:>8} {m['bytes'] / 1e6:>7.2f} "
              f"{m['records_ms_per_rank']:>8.2f} {m['manifest_of_s']:>6.3f} {m['dumps_s']:>6.3f} "
              f"{m['publish_s']:>7.3f} {m['prune_s']:>6.3f} {m['commit_s']:>7.3f} "
              f"{m['commit_wall_s']:>6.3f} {m['read_parse_s']:>6.3f} {m['check_sizes_s']:>6.3f}")


def print_growth(rows: list[dict], results: list[dict]) -> None:
    if len(results) < 2:
        return
    a, b = results[-2]["ranks"], results[-1]["ranks"]
    print(f"\nGrowth with the rank count: value ~ ranks^b; b fitted over "
          f"{', '.join(str(r['ranks']) for r in results)}, and b from {a} to {b} ranks "
          f"(value({b})/value({a}), ranks x{b / a:g}), which names the growth")
    print(f"{'metric':<42} {'per':<19} {'b fit':>5} {'b last':>6} {'ratio':>7}  growth")
    for g in rows:
        fit = "-" if g["exponent"] is None else f"{g['exponent']:.2f}"
        last = "-" if g["last_exponent"] is None else f"{g['last_exponent']:.2f}"
        ratio = "-" if g["last_ratio"] is None else f"{g['last_ratio']:.2f}"
        print(f"{g['metric']:<42} {g['per']:<19} {fit:>5} {last:>6} {ratio:>7}  {g['growth']}")


def summary(rows: list[dict], results: list[dict]) -> list[str]:
    """A few sentences: what grows how, and what grows faster than the ranks."""
    if len(results) < 2:
        return []
    by = {g["path"]: g for g in rows}
    first, last = results[0], results[-1]
    n0, n = first["ranks"], last["ranks"]

    def b(path: str) -> str:
        g = by[path]
        return "-" if g["last_exponent"] is None else f"{g['last_exponent']:.2f}"

    p0, p = first["plan"], last["plan"]
    lines = [(
        f"Save plan, per rank: {p['per_rank_ms'] / 1e3:.2f} s CPU at {n} ranks against "
        f"{p0['per_rank_ms'] / 1e3:.2f} s at {n0} (ranks^{b('plan.per_rank_ms')} at the top), "
        f"though a rank holds {last['tensors_per_rank']:.0f} tensors at any size: every rank "
        f"runs replicas.plan_writes over every rank's list ({last['held_items_total']:,} items "
        f"at {n} ranks), twice (rank_writer's provisional plan, "
        f"{p['plan_writes_ms'] / 1e3:.2f} s; replicas.settle, {p['settle_ms'] / 1e3:.2f} s). "
        f"All ranks together: {p['all_ranks_cpu_s']:,.0f} CPU-s per save "
        f"(ranks^{b('plan.all_ranks_cpu_s')}).")]
    s, f = (last["collectives"][k] for k in ("sizes_all_gather", "fingerprints_all_gather"))
    lines.append(
        f"The two all_gathers bring every rank's list to every rank: at {n} ranks each rank "
        f"receives {mb(s['recv_bytes_per_receiver'])} + {mb(f['recv_bytes_per_receiver'])} MB, "
        f"unpickles them in {s['unpickle_s_per_receiver']:.2f} + "
        f"{f['unpickle_s_per_receiver']:.2f} s CPU into about "
        f"{s['unpickled_mb_per_receiver']:.0f} + {f['unpickled_mb_per_receiver']:.0f} MB of "
        f"objects; {n * (s['recv_bytes_per_receiver'] + f['recv_bytes_per_receiver']) / 1e9:,.1f}"
        f" GB cross the network in all (ranks^2).")
    m, m0 = last["manifest"], first["manifest"]
    lines.append(
        f"Manifest: {m['bytes'] / 1e6:.2f} MB at {n} ranks against {m0['bytes'] / 1e6:.2f} MB at "
        f"{n0} (ranks^{b('manifest.bytes')} at the top): {m['files']} files, "
        f"{m['tensor_entries']:,} tensor entries of which {m['per_rank_tensor_entries']:,} "
        f"per-rank. With tp x pp fixed the shared entries ({last['distinct_keys']:,} keys) do "
        f"not grow with dp; the files, extras and per-rank entries grow one set per rank.")
    lines.append(
        f"Rank 0's commit (CheckpointManager._commit: build, dumps, publish, prune) takes "
        f"{m['commit_s']:.2f} s CPU at {n} ranks ({m0['commit_s']:.2f} s at {n0}). At a load "
        f"every rank parses the whole manifest ({m['read_parse_s']:.2f} s) and stats every "
        f"file ({m['check_sizes_s'] * 1e3:.0f} ms): {n * m['files']:,} stats and "
        f"{n * m['bytes'] / 1e9:.1f} GB of manifest read in all (ranks^2).")
    worse = [g for g in rows if g["growth"] == "SUPERLINEAR" and g["per"] != "all ranks"]
    if worse:
        lines.append("Faster than linear on one rank: " + "; ".join(
            f"{g['metric']} ({g['per']}, b={g['last_exponent']:.2f})" for g in worse) + ".")
    else:
        lines.append("On one rank nothing measured grows faster than linearly in the ranks; "
                     "what every rank repeats (the plan, the exchanges, a load's reads) "
                     "grows as ranks^2 in all.")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", help=f"rank counts [{','.join(map(str, FULL_RANKS))}]")
    ap.add_argument("--quick", action="store_true",
                    help=f"rank counts {','.join(map(str, QUICK_RANKS))} (under a minute)")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=8)
    ap.add_argument("--layers", type=int, default=Model.layers)
    ap.add_argument("--d-model", type=int, default=Model.d_model)
    ap.add_argument("--vocab", type=int, default=Model.vocab)
    ap.add_argument("--samples", type=int, default=2,
                    help="ranks on which the (identical) plan is computed and timed [2]")
    ap.add_argument("--dir", default=DEFAULT_DIR,
                    help=f"where the simulated root goes [{DEFAULT_DIR}: the storage is not "
                    "what is measured here, benchmarks/ckpt_bench.py measures it]")
    ap.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    args = ap.parse_args(argv)
    ranks = ([int(x) for x in args.ranks.split(",")] if args.ranks
             else list(QUICK_RANKS if args.quick else FULL_RANKS))
    model = Model(args.layers, args.d_model, args.vocab)
    print(f"Simulated sync save: GPT {model.layers} layers, d_model {model.d_model}, vocab "
          f"{model.vocab}; tp={args.tp}, pp={args.pp}, dp = ranks / {args.tp * args.pp}; "
          f"bf16 parameters, fp32 AdamW state; root under {args.dir}")
    results = []
    work = Path(tempfile.mkdtemp(prefix="ckpt-scale-sim-", dir=args.dir))
    try:
        for n in ranks:
            sim = simulate(n, work, tp=args.tp, pp=args.pp, model=model, samples=args.samples,
                           log=lambda s: print(s, file=sys.stderr, flush=True))
            results.append(sim.figures)
            del sim
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_tables(results)
    rows = growth(results)
    print_growth(rows, results)
    lines = summary(rows, results)
    if lines:
        print("\nSummary")
        for line in lines:
            print(f"- {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"model": dataclasses.asdict(model), "tp": args.tp, "pp": args.pp,
             "gpus_per_node": GPUS_PER_NODE, "drives": DRIVES, "stands_in": STANDS_IN,
             "results": results, "growth": rows,
             "summary": lines}, indent=1))
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
