"""The checkpoint's save plan, manifest and load, simulated at 64 to 16,384 ranks.

In one process (no Slurm, no process per rank), through hpctrain's own planning, manifest
and loading code:

    .venv/bin/python benchmarks/ckpt_scale_sim.py                  # 64 ... 16384 ranks
    .venv/bin/python benchmarks/ckpt_scale_sim.py --quick          # 64, 256, 1024 (~1 min)
    .venv/bin/python benchmarks/ckpt_scale_sim.py --ranks 1024,16384 --json /tmp/sim.json

The state is a GPT-3-175B-like model (96 layers, d_model 12288, vocab 51200) laid out as
examples/train_gpt.py lays it out: ranks ordered tp fastest, then dp, then pp; q/k/v/fc1
column-parallel and o/fc2 row-parallel DTensors over the tp mesh (their row-parallel biases
Replicate), the embeddings and head vocab-parallel, the layer norms plain tensors; AdamW's
state per parameter (exp_avg, exp_avg_sq as the parameter; step, a plain scalar), its
param_groups and the data position as extras, and each rank's own RNG state (a plain
tensor that differs by rank). tp and pp are fixed (8 x 8 by default) and dp grows with the
ranks: at 16,384 ranks tp=8, pp=8, dp=256; 769-781 tensors per rank.

Tensors are metadata where the code allows: a DTensor's global shape is real and its local
tensor one element (the plan and the manifest use only the box and its byte count); plain
tensors (layer norms, optimizer steps, RNG states) are real, since their bytes are
fingerprinted. Data files are sparse files of the recorded size: no tensor bytes are written.

Two saves run, as a training job makes them: the first (step 1000: the plan is made) and a
later one of the same structure with new values (step 1001: new layer norms, moments, step
counters, RNG states and data positions: the plan is reused, the values compared again).
What runs for real, per simulated rank: ``tree.flatten`` (the DTensor branch under torch's
own *fake* process-group backend, ``torch.testing._internal.distributed.fake_pg``, which
gives each rank its tp coordinate without communicating); ``saveplan.Structure`` (the
structure and its digest), ``PlanCache.vote``, ``.reused``, ``.adopt`` and ``.settled``;
``writer.fingerprints``, ``writer.extras_fingerprints`` and ``saveplan.fingerprint_message``;
``RankSave._records`` (the manifest records and the extras file). On rank 0, the
coordinator: ``coordinator.plan`` (``Coordinator``: ``replicas.plan_writes`` over the
groups of equal structures, each rank's part) and ``coordinator.settle`` (each rank's
answer, ``replicas.Agreement``); ``CheckpointManager._persist`` and ``_commit``
(``commit.manifest_of``, ``commit.publish``: the head and ``manifest.ranks``,
``catalog.prune``). At load, on ``--samples`` ranks: ``reader.read_rank_view`` (the head and
the rank's own record) and ``loader.prepare`` (the reads it will make; a stat of each file
it reads); on rank 0 ``reader.read_manifest`` and ``StepReader.check_sizes`` (every
record, every file: what ``ckpt list`` and each save's prune read).

What does not run: torch.distributed's collectives. The simulated ranks run one after
another, so the plan's exchanges (``exchange.provisional`` and ``exchange.settle``: an
all-reduce of the votes, a gather to rank 0, a scatter back) are run as their three
steps, each rank's contribution handed to the next step as ``comm.Comm``'s collectives
hand it; the bytes they would carry are counted from the messages themselves, as
``comm.Comm`` frames them (an 8-byte length each, the largest message's size agreed in an
all-reduce or a broadcast of one int64). The records' gather to rank 0 (``_persist``) goes
through :class:`FakeComm`, which pickles each rank's records as ``Comm.gather`` does.
``RankSave._write_first`` and the rest of ``RankSave.write`` (the data I/O): their blocks
are built from the chunks' byte counts and the fingerprints (a written block's sum is by
construction its chunk's fingerprint), with a stand-in sum for DTensor shards.

Figures per rank count: for each save, a rank's planning CPU (median over the ranks; the
checksums of its plain values apart: they are the per-rank rule's cost, O(the bytes it
holds)) and the bytes it receives for planning; the coordinator's CPU and bytes; the
manifest; rank 0's commit; a loading rank's CPU (its view of the manifest, the reads it
prepares, the files it stats) against reading the whole manifest; then how each grows
(fitted exponent of the rank count, and the one between the last two). ``--json FILE``
writes them all. Times are this process's CPU time (the machine is shared; a rank's part
is single-threaded), taken with the garbage collector off: this process holds every
simulated rank's objects, which no real rank's collector would walk.
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
DRIVES = ["tree.flatten", "saveplan.Structure (digest, contribution)", "PlanCache.vote",
          "PlanCache.reused", "PlanCache.adopt", "PlanCache.settled", "writer.fingerprints",
          "writer.extras_fingerprints", "saveplan.fingerprint_message", "coordinator.plan",
          "coordinator.Coordinator", "coordinator.cpus_per_rank", "replicas.plan_writes",
          "coordinator.settle", "replicas.Agreement", "RankSave._records",
          "fileio.write_segments", "CheckpointManager._persist", "CheckpointManager._commit",
          "commit.manifest_of", "commit.publish", "ranksfile.encode", "storage.apply_modes",
          "catalog.prune", "reader.read_rank_view", "ranksfile.read_record",
          "loader.prepare", "StepReader.check_files", "reader.read_manifest",
          "manifest.parse", "manifest.parse_part", "StepReader.check_sizes"]
STANDS_IN = {"comm.Comm's all_reduce_max, gather_bytes, scatter_bytes":
                 "the simulation's sequencing of exchange.provisional and exchange.settle; "
                 "bytes counted from the messages as comm.Comm frames them",
             "comm.Comm.gather (the records, to rank 0)": "FakeCollective / FakeComm",
             "DeviceMesh's process group": "torch's fake backend (fake_pg), one tp rank at a time",
             "RankSave._write_first and the data I/O of RankSave.write":
                 "blocks from the chunks' byte counts; sparse data files; stand-in sums for "
                 "DTensor shards"}
GPUS_PER_NODE = 8    # simulated ranks per host (what writer.node_cpus reports for each)
CPUS_PER_RANK = 12   # each rank's CPU affinity: a 96-core node with 8 GPUs
FULL_RANKS = (64, 256, 1024, 4096, 16384)
QUICK_RANKS = (64, 256, 1024)
FRAME = 8            # comm.Comm: each message framed with its length (int64)
INT = 8              # one int64 of an all-reduce or a broadcast
# Figures are this process's CPU time (user + system): a simulated rank's work is
# single-threaded, and on a shared machine wall time mostly measures the neighbours.
clock = time.process_time
# tmpfs when there is one: thousands of small files and sparse ones; the disk's fsyncs and
# unlinks would only add noise (the figures are CPU time anyway)
DEFAULT_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


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
    """One rank's whole state: its stage's, its own RNG state (another at each step), the
    data position."""
    import torch

    seed = 100_003 * step + rank
    return {**stage, "step": step,
            "rng": {"torch": torch.Generator().manual_seed(seed).get_state()},
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


# -- the records' gather ------------------------------------------------------------
class FakeCollective:
    """FAKE collective: a recorded-behaviour stand-in for the commit's gather of every
    rank's records (:meth:`hpctrain.checkpoint.comm.Comm.gather`). Each rank's contribution
    is pickled as ``Comm.gather`` pickles it and held; rank 0, reaching it last, gets every
    rank's object unpickled, in rank order. The network is not modelled; :meth:`figures`
    gives the bytes it would carry."""

    def __init__(self, name: str, world: int) -> None:
        self.name, self.world = name, world
        self.blobs: list[bytes | None] = [None] * world
        self.unpickle_s = 0.0

    def record(self, rank: int, obj: Any) -> None:
        self.blobs[rank] = pickle.dumps(obj, protocol=5)  # what Comm.gather sends

    def exchange(self, rank: int, obj: Any) -> list[Any]:
        self.record(rank, obj)
        missing = [r for r, b in enumerate(self.blobs) if b is None]
        if missing:
            raise AssertionError(f"{self.name}: no contribution from ranks {missing[:5]}")
        start = clock()
        out = [pickle.loads(b) for b in self.blobs]  # type: ignore[arg-type]
        self.unpickle_s = clock() - start
        return out

    def figures(self) -> dict[str, float]:
        sizes = [len(b) for b in self.blobs if b is not None]
        return {"bytes_per_rank_max": max(sizes), "bytes_total": sum(sizes),
                # Comm.gather_bytes pads each contribution to the largest (its size agreed
                # in an all-reduce): rank 0 gets world x max, every other rank one int64
                "recv_bytes_rank0": self.world * (max(sizes) + FRAME),
                "recv_bytes_per_rank": INT,
                "unpickle_s_rank0": self.unpickle_s}


class FakeComm:
    """The interface of :class:`hpctrain.checkpoint.comm.Comm` for rank 0 of the commit,
    its gather served by a :class:`FakeCollective`; a broadcast is rank 0's own object."""

    active = True

    def __init__(self, rank: int, world: int, collective: FakeCollective | None = None) -> None:
        self.rank, self.world, self.collective = rank, world, collective

    def gather(self, obj: Any) -> list[Any] | None:
        assert self.collective is not None and self.rank == 0
        return self.collective.exchange(self.rank, obj)

    def broadcast(self, obj: Any) -> Any:
        assert self.rank == 0, "only rank 0's view of a broadcast is simulated"
        return obj


class Probes:
    """CPU and wall time spent in named functions while a block runs (wrapped, then
    restored)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}     # CPU
        self.wall: dict[str, float] = {}
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        own = name in vars(owner)   # else inherited (a method): deleted after
        real = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start, wall = clock(), time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + clock() - start
                self.wall[label] = self.wall.get(label, 0.0) + time.perf_counter() - wall

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, real) if own else delattr(owner, name))

    def __enter__(self) -> Probes:
        return self

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()


def simulated_node(rank: int) -> tuple[str, frozenset[int]]:
    """What ``writer.node_cpus`` reports on ``rank``: its node (GPUS_PER_NODE ranks a node)
    and its CPUs (CPUS_PER_RANK of them), not this machine's."""
    first = (rank % GPUS_PER_NODE) * CPUS_PER_RANK
    return f"gpu{rank // GPUS_PER_NODE:05d}", frozenset(range(first, first + CPUS_PER_RANK))


class Blocks:
    """Every simulated rank's state, made (tp coordinate, stage) by (tp coordinate, stage):
    the dp ranks of one share the stage's tensors, as replicas hold equal bytes."""

    def __init__(self, lay: Layout, model: Model, steps: list[int]) -> None:
        self.lay = lay
        self.params = [stage_params(model, p, lay.pp) for p in range(lay.pp)]
        # new layer norms and moments at each step: a later save's values are new
        self.plain = {s: [StagePlain(self.params[p], s, seed=p + 97 * s) for p in range(lay.pp)]
                      for s in steps}

    def states(self, steps: list[int], ranks: set[int] | None = None
               ) -> Iterator[tuple[int, dict[int, dict]]]:
        """(rank, {step: its state}) for every rank (or ``ranks``), within the fake process
        group of its tp coordinate."""
        from hpctrain.checkpoint import tree

        lay = self.lay
        for t in range(lay.tp):
            if ranks is not None and not any(r % lay.tp == t for r in ranks):
                continue
            with fake_process_group(t, lay.tp) as mesh:
                tree._local_box.cache_clear()  # its key (the mesh) is equal across tp ranks
                for p in range(lay.pp):
                    stages = {s: stage_state(self.params[p], self.plain[s][p], mesh)
                              for s in steps}
                    for d in range(lay.dp):
                        r = lay.rank(p, d, t)
                        if ranks is None or r in ranks:
                            yield r, {s: rank_state(stages[s], r, d, s) for s in steps}
                    del stages


# -- one simulation ---------------------------------------------------------------------
@dataclass
class Sim:
    """One simulated pair of saves and a load: figures, and what the tests look at."""

    layout: Layout
    step: int
    figures: dict[str, Any] = field(default_factory=dict)
    sampled: list[int] = field(default_factory=list)
    chunks: list[list] = field(default_factory=list)     # per rank (<= 64 ranks): tree.Chunk
    plans: list = field(default_factory=list)            # per rank: its provisional RankPlan
    finals: list = field(default_factory=list)           # per rank: (settled plan, own extras)
    later: list = field(default_factory=list)            # the same, of the later save
    coordinator: Any = None
    manifest: Any = None                                 # as read back whole from disk
    manifest_bytes: bytes = b""                          # the head, manifest.json


def warm_imports() -> None:
    """Import what the simulation uses before it starts: a first import of torch's
    distributed modules leaves reference cycles of frames behind (caught exceptions), and
    every frame below it on the stack with them, which would hold a simulation's locals
    (every rank's state) until the garbage collector, off while it runs, comes by."""
    import torch.distributed.tensor  # noqa: F401
    import torch.distributed.tensor._utils  # noqa: F401
    from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    from torch.testing._internal.distributed import fake_pg  # noqa: F401

    from hpctrain.checkpoint import (catalog, commit, coordinator, loader, manager,  # noqa: F401
                                     reader, saveplan, writer)


def sample_ranks(world: int, samples: int) -> list[int]:
    """Rank 0, the last rank, then ranks between: ``samples`` of them (at least one)."""
    picks = list(dict.fromkeys([0, world - 1, world // 2, world // 4, (3 * world) // 4]))
    return sorted(picks[:max(1, samples)])


def simulate(world: int, workdir: Path, *, tp: int = 8, pp: int = 8, model: Model = Model(),
             samples: int = 3, step: int = 1000, keep: bool = False,
             log: Callable[[str], None] = lambda s: None) -> Sim:
    """Simulate two saves of ``world`` ranks (the plan made, then reused) into a fresh root
    under ``workdir``, and the first one's load.

    The garbage collector is off meanwhile: this process holds every simulated rank's
    caches and messages, which no real rank's collector walks, so its collections would
    measure the simulation; the figures are the code's own cost (reference counting still
    frees)."""
    warm_imports()
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(world, workdir, tp=tp, pp=pp, model=model, samples=samples,
                         step=step, keep=keep, log=log)
    finally:
        if enabled:
            gc.enable()


class Timer:
    """Per-rank CPU seconds of named parts (each rank's own, summed per rank)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.parts: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def __call__(self, part: str, rank: int) -> Iterator[None]:
        start = clock()
        yield
        self.parts.setdefault(part, [0.0] * self.world)[rank] += clock() - start

    def median(self, *parts: str) -> float:
        """The median over the ranks of the sum of ``parts``."""
        return statistics.median(sum(self.parts[p][r] for p in parts) for r in range(self.world))


def _intern(structure: Any, seen: dict) -> Any:
    """Keep one copy of each distinct structure's lists (ranks of a group hold equal
    ones; the simulation holds every rank's), and drop the pickle the digest was taken of."""
    structure.items, structure.extras = seen.setdefault(structure.digest,
                                                        (structure.items, structure.extras))
    structure.__dict__.pop("_pickled", None)
    return structure


def _votes(votes: list[list[int]]) -> list[int]:
    """``comm.Comm.all_reduce_max`` of every rank's vote."""
    return [max(column) for column in zip(*votes)]


def _simulate(world: int, workdir: Path, *, tp: int, pp: int, model: Model, samples: int,
              step: int, keep: bool, log: Callable[[str], None]) -> Sim:
    from hpctrain.checkpoint import coordinator, tree
    from hpctrain.checkpoint.saveplan import PlanCache, Structure, fingerprint_message

    lay = layout_for(world, tp, pp)
    sim = Sim(lay, step, sampled=sample_ranks(world, samples))
    later = step + 1
    blocks = Blocks(lay, model, [step, later])
    timer, wall0 = Timer(world), time.perf_counter()
    caches = [PlanCache() for _ in range(world)]
    structures: list[Any] = [None] * world
    seen: dict = {}
    fig: dict[str, Any] = {"ranks": world, "tp": lay.tp, "pp": lay.pp, "dp": lay.dp}

    def progress(what: str) -> None:
        log(f"  {world} ranks: {what} ({time.perf_counter() - wall0:.1f} s)")

    # 1. the first save, as far as each rank goes alone: its structure and vote, its
    # contribution to the planning gather, its fingerprints (sent once the plan is in)
    votes, contributions, counts = [], [b""] * world, [0] * world
    prints: list[list[int]] = [[] for _ in range(world)]
    pickled: list[bytes] = [b""] * world     # its extras, for its records
    chunks_of: dict[int, list] = {}
    for r, states in blocks.states([step]):
        with timer("flatten", r):
            chunks, extras = tree.flatten(states[step])
        with timer("structure", r):
            s = Structure.of(chunks, list(extras), simulated_node(r))
            votes.append(caches[r].vote(s))
        with timer("contribution", r):
            contributions[r] = s.contribution()
        with timer("fingerprints", r):
            prints[r] = _fingerprints(chunks, extras)
        structures[r], counts[r] = _intern(s, seen), len(chunks)
        pickled[r] = pickle.dumps(extras, protocol=5)
        if world <= 64:
            chunks_of[r] = chunks
    sim.chunks = [chunks_of[r] for r in sorted(chunks_of)]
    agreed = _votes(votes)
    progress("structures")

    # 2. the coordinator plans; every rank adopts its part, sends its fingerprints
    start = clock()
    parts, made = coordinator.plan(contributions)
    coord_plan_s = clock() - start
    if made is None:
        raise AssertionError(pickle.loads(parts[0])[1])
    sim.coordinator = made
    gather_in = world * (max(map(len, contributions)) + FRAME)
    del contributions
    sim.plans, messages = [None] * world, [b""] * world
    for r in range(world):
        with timer("adopt", r):
            if caches[r].reused(agreed) is not None:
                raise AssertionError("a first save reused a plan")
            sim.plans[r] = caches[r].adopt(structures[r], parts[r], made if r == 0 else None)
        with timer("message", r):
            messages[r] = fingerprint_message(prints[r], sim.plans[r].message)
    part_in = max(map(len, parts)) + FRAME
    del parts
    progress("planned")

    # 3. the coordinator answers; each rank settles and records its files. Then the later
    # save, as far as each rank goes alone: structure, vote, fingerprints
    start = clock()
    answers = coordinator.settle(caches[0].coordinator, messages)
    coord_settle_s = clock() - start
    message_in = world * (len(messages[0]) + FRAME)
    answer_in = max(map(len, answers)) + FRAME
    del messages
    stage = Path(tempfile.mkdtemp(prefix="stage-", dir=workdir))
    records = FakeCollective("records gather", world)
    later_votes: list[list[int]] = []
    later_messages: list[bytes] = [b""] * world
    sim.finals = [None] * world
    for r, states in blocks.states([later]):
        chunks, extras = tree.flatten(states[later])
        with timer("settled", r):
            sim.finals[r] = caches[r].settled(sim.plans[r], answers[r], structures[r])
        records.record(r, ("ok", _records(r, world, caches[r], sim.plans[r], sim.finals[r],
                                           structures[r], chunks, prints[r], pickled[r],
                                           stage, timer)))
        with timer("later structure", r):
            s = Structure.of(chunks, list(extras), simulated_node(r))
            later_votes.append(caches[r].vote(s))
        if s.digest != structures[r].digest:
            raise AssertionError("the later save's structure differs")
        with timer("later fingerprints", r):
            mine = _fingerprints(chunks, extras)
        with timer("later message", r):
            later_messages[r] = fingerprint_message(mine, caches[r].plan.message)
    del answers, prints, pickled
    progress("first save settled; later save fingerprinted")

    # 4. rank 0 commits the first save
    root = Path(tempfile.mkdtemp(prefix=f"ckpt-sim-{world}-", dir=workdir))
    commit_fig = _commit(root, stage, step, world, records)
    shutil.rmtree(stage, ignore_errors=True)
    progress("committed")

    # 5. the later save: one all-reduce says nothing changed; fingerprints compared again
    agreed = _votes(later_votes)
    for r in range(world):
        with timer("later reused", r):
            if caches[r].reused(agreed) is not sim.plans[r]:
                raise AssertionError(f"rank {r} did not reuse its plan")
    start = clock()
    answers = coordinator.settle(caches[0].coordinator, later_messages)
    coord_later_s = clock() - start
    later_answer_in = max(map(len, answers)) + FRAME
    del later_messages
    sim.later = [None] * world
    for r in range(world):
        with timer("later settled", r):
            sim.later[r] = caches[r].settled(sim.plans[r], answers[r], structures[r])
    del answers
    _check_plans(sim, structures)
    progress("later save settled")

    # 6. the load: sampled ranks' views and reads; rank 0's whole manifest
    load = _load(sim, blocks, root, step)
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    progress("loaded")

    vote_in = 3 * INT
    fig.update({
        "tensors_per_rank": statistics.mean(counts),
        "distinct_structures": len(sim.coordinator.ranks),
        "distinct_keys": len(sim.coordinator.plan.owner) + len(sim.coordinator.plan.per_rank),
        "sampled_ranks": sim.sampled,
        "flatten_s": timer.median("flatten"),
        "first_save": {
            "plan_s": timer.median("structure", "contribution", "adopt", "message", "settled"),
            "fingerprint_s": timer.median("fingerprints"),
            # votes; the gather's size (an all-reduce); the part and the answer, each after
            # a broadcast of its size (an int64)
            "bytes_in": vote_in + INT + (INT + part_in) + (INT + answer_in),
            "coordinator_s": coord_plan_s + coord_settle_s,
            "coordinator_plan_s": coord_plan_s,
            "coordinator_settle_s": coord_settle_s,
            "coordinator_bytes_in": gather_in + message_in,
        },
        "later_save": {
            "plan_s": timer.median("later structure", "later reused", "later message",
                                   "later settled"),
            "fingerprint_s": timer.median("later fingerprints"),
            "bytes_in": vote_in + (INT + later_answer_in),
            "coordinator_s": coord_later_s,
            "coordinator_bytes_in": message_in,
        },
        "records_s": timer.median("records"),
        "commit": commit_fig,
        "load": load,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "sim_wall_s": time.perf_counter() - wall0,
    })
    sim.figures = fig
    return sim


def _fingerprints(chunks: list, extras: dict) -> list[int]:
    """A rank's fingerprints in its structure's order (what RankSave.write sends): the
    checksum of each plain chunk (``writer.fingerprints``), then of each extra."""
    from hpctrain.checkpoint import writer

    crcs = writer.fingerprints(chunks)
    return [crcs[c.key()] for c in chunks if not c.sharded] \
        + list(writer.extras_fingerprints(extras).values())


def _records(rank: int, world: int, cache: Any, plan: Any, settled: Any, structure: Any,
             chunks: list, prints: list[int], extras: bytes, stage: Path, timer: Timer) -> Any:
    """What rank ``rank`` adds to the first save's manifest (``RankSave._records``, for
    real) and its files in ``stage``: the chunks the settled plan gives it, in the order
    RankSave.write writes them (first, then the per-rank values found), blocks from their
    byte counts and the fingerprints ``prints`` (a written block's sum is its chunk's; a
    stand-in sum for DTensor shards), the data file sparse, ``extras`` (pickled) its extras
    file. ``chunks`` give the keys, dtypes and shapes (the later save's: the same
    structure, asserted by its digest)."""
    from hpctrain.checkpoint import writer

    final, own_extras = settled
    crcs = dict(zip((c.key() for c in chunks if not c.sharded), prints))
    first = [c for c in chunks if plan.writes(c.key())]
    more = [c for c in chunks if final.writes(c.key()) and not plan.writes(c.key())]
    written = [dataclasses.replace(c, rank=rank) if c.key() in final.per_rank else c
               for c in first + more]
    blocks, off = [], 0
    for c in written:
        crc = zlib.crc32(repr((c.key(), rank)).encode()) if c.sharded else crcs[c.key()]
        blocks.append((off, c.nbytes, crc))
        off += c.nbytes
    data_name = f"rank{rank:05d}.bin"
    with open(stage / data_name, "wb") as f:
        f.truncate(off)  # sparse: the recorded size, no bytes
    save = writer.RankSave(FakeComm(rank, world), cache, plan, structure,
                           writer.RankPayload(chunks, extras), {}, None, None)
    with timer("records", rank):
        return save._records(stage, data_name, off, written, blocks, own_extras)


def _commit(root: Path, stage: Path, step: int, world: int, records: FakeCollective) -> dict:
    """Rank 0's part of the first save (``CheckpointManager._persist``), every rank's files
    moved into its temporary directory (the simulated writes) and records gathered."""
    from hpctrain.checkpoint import catalog, commit, storage
    from hpctrain.checkpoint.manager import CheckpointManager

    moved = {"s": 0.0}

    def write_all(tmp: Path) -> Any:
        start = clock()
        for name in os.listdir(stage):
            os.rename(stage / name, tmp / name)
        moved["s"] = clock() - start
        return pickle.loads(records.blobs[0])[1]   # type: ignore[arg-type]

    mgr = CheckpointManager(root, keep_last=3)
    try:
        mgr.comm = FakeComm(0, world, records)
        with Probes() as probes:
            probes.wrap(commit, "manifest_of", "manifest_of")
            probes.wrap(commit, "publish", "publish")
            probes.wrap(storage, "apply_modes", "apply_modes")
            probes.wrap(catalog, "prune", "prune")
            probes.wrap(mgr, "_commit", "commit")
            start = clock()
            mgr._persist(step, write_all, {"kind": "torch"})
            persist_s = clock() - start
    finally:
        mgr.close()
    gathered = records.figures()
    return {"records_gather": gathered,
            "manifest_of_s": probes.seconds.get("manifest_of", 0.0),
            "publish_s": probes.seconds.get("publish", 0.0),
            "apply_modes_s": probes.seconds.get("apply_modes", 0.0),
            "prune_s": probes.seconds.get("prune", 0.0),
            "commit_s": probes.seconds.get("commit", 0.0),
            "commit_wall_s": probes.wall.get("commit", 0.0),
            # rank 0's own part of _persist: not the simulated ranks' files moved in
            "persist_rank0_s": persist_s - moved["s"]}


def _check_plans(sim: Sim, structures: list) -> None:
    """Every rank's own values are its RNG state, in both saves; every shared value is
    written once (the tests check the manifest itself)."""
    for r, ((final, own), (again, own_again)) in enumerate(zip(sim.finals, sim.later)):
        rng = {key for key, _, _ in structures[r].items if key[0][0] == "rng"}
        if final.per_rank != rng or again.per_rank != rng or own != own_again:
            raise AssertionError(f"rank {r}: own values {sorted(final.per_rank)[:3]}, "
                                 f"later {sorted(again.per_rank)[:3]}")


def _load(sim: Sim, blocks: Blocks, root: Path, step: int) -> dict:
    """The load's cost: on the sampled ranks their view of the manifest and the reads they
    prepare (with the stat of each file read); on rank 0 the whole manifest and a stat of
    every file, as every rank did before format 5."""
    from hpctrain.checkpoint import loader
    from hpctrain.checkpoint.manifest import MANIFEST, step_dirname
    from hpctrain.checkpoint.reader import StepReader, read_manifest, read_rank_view

    step_dir = root / step_dirname(step)
    view_s, prepare_s, files, own_files, added = [], [], [], [], []
    for r, states in blocks.states([step], set(sim.sampled)):
        start = clock()
        view = read_rank_view(step_dir, r)
        view_s.append(clock() - start)
        start = clock()
        ops, fresh, extras_file, _ = loader.prepare(StepReader(step_dir, view), states[step], r)
        prepare_s.append(clock() - start)
        # a saved tensor the state lacks is added only where the state leaves its place
        # open (docs/checkpoint.md): the other stages' layers are not (0 here); were they,
        # their owners' files would be read too
        new = {id(c) for c in fresh}
        files.append(len({e.file for e, _, _ in ops} | {extras_file}))
        own_files.append(len({e.file for e, c, _ in ops if id(c) not in new} | {extras_file}))
        added.append(len(fresh))
    start = clock()
    sim.manifest = read_manifest(step_dir)
    whole_s = clock() - start
    start = clock()
    problem = StepReader(step_dir, sim.manifest).check_sizes()
    stat_s = clock() - start
    if problem:
        raise AssertionError(problem)
    sim.manifest_bytes = (step_dir / MANIFEST).read_bytes()
    man = sim.manifest
    med = statistics.median
    return {"per_rank_s": med(v + p for v, p in zip(view_s, prepare_s)),
            "view_s": med(view_s), "prepare_s": med(prepare_s), "files_read": med(files),
            "files_read_own": med(own_files), "tensors_added": med(added),
            "whole_manifest_s": whole_s + stat_s, "whole_read_s": whole_s,
            "whole_stat_s": stat_s,
            "head_bytes": len(sim.manifest_bytes),
            "ranks_file_bytes": man.ranks.size if man.ranks else 0,
            "manifest_bytes": len(sim.manifest_bytes) + (man.ranks.size if man.ranks else 0),
            "files": len(man.files), "tensor_entries": len(man.tensors),
            "per_rank_tensor_entries": sum(1 for t in man.tensors if t.rank is not None)}


# -- growth and output ----------------------------------------------------------------
METRICS: list[tuple[str, str, str]] = [
    # (label, path in the figures, what it is per)
    ("first save: plan CPU", "first_save.plan_s", "per rank"),
    ("first save: bytes received", "first_save.bytes_in", "per rank"),
    ("first save: coordinator CPU", "first_save.coordinator_s", "rank 0"),
    ("first save: coordinator bytes received", "first_save.coordinator_bytes_in", "rank 0"),
    ("later save: plan CPU", "later_save.plan_s", "per rank"),
    ("later save: bytes received", "later_save.bytes_in", "per rank"),
    ("later save: coordinator CPU", "later_save.coordinator_s", "rank 0"),
    ("fingerprints (checksums)", "later_save.fingerprint_s", "per rank"),
    ("flatten", "flatten_s", "per rank"),
    ("records (RankSave._records)", "records_s", "per rank"),
    ("records gather: bytes at rank 0", "commit.records_gather.recv_bytes_rank0", "rank 0"),
    ("CheckpointManager._commit", "commit.commit_s", "rank 0"),
    ("manifest files", "load.files", "rank 0"),
    ("manifest bytes (head + records)", "load.manifest_bytes", "rank 0"),
    ("manifest head bytes", "load.head_bytes", "every rank at load"),
    ("load: view + prepare", "load.per_rank_s", "per rank"),
    ("load: view of the manifest", "load.view_s", "per rank"),
    ("load: files stat-ed", "load.files_read", "per rank"),
    ("load: files of its own tensors", "load.files_read_own", "per rank"),
    ("whole manifest read + stat", "load.whole_manifest_s", "rank 0"),
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


def kb(n: float) -> str:
    return f"{n / 1e3:.1f}" if n < 1e5 else f"{n / 1e3:,.0f}"


def print_tables(results: list[dict]) -> None:
    print("\nSave plan, per rank (CPU ms, median over the ranks; checksums of the plain values "
          "apart) and bytes received for planning;")
    print("the coordinator (rank 0): CPU s, MB received")
    print(f"{'ranks':>6} {'tp x pp x dp':>13} {'groups':>6} | {'first: ms':>9} {'KB in':>6} "
          f"{'coord s':>7} {'coord MB':>8} | {'later: ms':>9} {'KB in':>6} {'coord s':>7} "
          f"{'coord MB':>8} | {'sums ms':>7}")
    for r in results:
        f, lt = r["first_save"], r["later_save"]
        print(f"{r['ranks']:>6} {r['tp']:>4} x {r['pp']} x {r['dp']:<3} "
              f"{r['distinct_structures']:>6} | {1e3 * f['plan_s']:>9.2f} {kb(f['bytes_in']):>6} "
              f"{f['coordinator_s']:>7.2f} {f['coordinator_bytes_in'] / 1e6:>8.1f} | "
              f"{1e3 * lt['plan_s']:>9.2f} {kb(lt['bytes_in']):>6} {lt['coordinator_s']:>7.2f} "
              f"{lt['coordinator_bytes_in'] / 1e6:>8.1f} | {1e3 * lt['fingerprint_s']:>7.2f}")
    print("\nCommit (rank 0, CPU s) and manifest: head (every loading rank reads it), records "
          "(manifest.ranks: a rank reads its own)")
    print(f"{'ranks':>6} {'files':>6} {'tensors':>8} {'per-rank':>8} {'head MB':>8} "
          f"{'ranks MB':>8} {'build':>6} {'publish':>7} {'prune':>6} {'commit':>7}")
    for r in results:
        c, ld = r["commit"], r["load"]
        print(f"{r['ranks']:>6} {ld['files']:>6} {ld['tensor_entries']:>8} "
              f"{ld['per_rank_tensor_entries']:>8} {ld['head_bytes'] / 1e6:>8.2f} "
              f"{ld['ranks_file_bytes'] / 1e6:>8.2f} {c['manifest_of_s']:>6.3f} "
              f"{c['publish_s']:>7.3f} {c['prune_s']:>6.3f} {c['commit_s']:>7.3f}")
    print("\nLoad, per rank (CPU s, median of the sampled ranks): its view of the manifest, "
          "the reads it prepares (and the stat")
    print("of each file it reads); against the whole manifest read and every file stat-ed "
          "(rank 0's prune, ckpt list; every rank before format 5)")
    print("(files: those it reads, those holding its own tensors; added: the saved tensors its "
          "state lacks and leaves room for)")
    print(f"{'ranks':>6} {'view':>7} {'prepare':>7} {'total':>7} {'files':>6} {'own':>5} "
          f"{'added':>6} | {'whole read':>10} {'stat all':>8}")
    for r in results:
        ld = r["load"]
        print(f"{r['ranks']:>6} {ld['view_s']:>7.3f} {ld['prepare_s']:>7.3f} "
              f"{ld['per_rank_s']:>7.3f} {ld['files_read']:>6.0f} {ld['files_read_own']:>5.0f} "
              f"{ld['tensors_added']:>6.0f} | {ld['whole_read_s']:>10.3f} "
              f"{ld['whole_stat_s']:>8.3f}")


def markdown_table(results: list[dict]) -> str:
    """docs/scale.md's table of the figures above, ready to paste. Pure."""
    def num(n: float) -> str:
        return f"{n:,.0f}"

    def mb(n: float) -> str:
        return f"{n / 1e6:.1f}"

    def sec(n: float) -> str:
        return f"{n:.2f}" if n >= 0.1 else f"{n:.3f}"

    lines = ["| ranks (dp) | plan CPU per rank, first / later save | received per rank for "
             "planning, first / later | rank 0 (coordinator) CPU, first / later | rank 0 "
             "receives, first / later | load per rank: its view + the reads it prepares "
             "(median of the sum) | files a loading rank stats (of them, its own tensors') |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        f, lt, ld = r["first_save"], r["later_save"], r["load"]
        lines.append(
            f"| {num(r['ranks'])} ({r['dp']}) | {1e3 * f['plan_s']:.1f} / "
            f"{1e3 * lt['plan_s']:.1f} ms | {f['bytes_in']:.0f} / {lt['bytes_in']:.0f} B | "
            f"{sec(f['coordinator_s'])} / {sec(lt['coordinator_s'])} s | "
            f"{mb(f['coordinator_bytes_in'])} / {mb(lt['coordinator_bytes_in'])} MB | "
            f"{ld['view_s']:.3f} + {ld['prepare_s']:.3f} s ({ld['per_rank_s']:.3f} s) | "
            f"{num(ld['files_read'])} ({num(ld['files_read_own'])}) |")
    return "\n".join(lines)


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


TARGETS = {  # the (42): per rank at the largest rank count, and the load's growth
    "later_save.plan_s": 0.010, "later_save.bytes_in": 64_000, "first_save.plan_s": 1.0,
    "first_save.coordinator_s": 10.0}
LOAD_GROWTH = (1024, 16384, 1.2)   # load per rank grows <= 1.2x from 1,024 to 16,384 ranks


def summary(rows: list[dict], results: list[dict]) -> list[str]:
    """A few sentences: the targets, what grows how, what grows faster than the ranks."""
    last = results[-1]
    n = last["ranks"]
    lines = []
    for path, limit in TARGETS.items():
        value = get(last, path)
        lines.append(f"{path} at {n} ranks: {value:.4g} (target <= {limit:g}): "
                     f"{'MET' if value <= limit else 'MISSED'}")
    by = {r["ranks"]: r for r in results}
    low, high, limit = LOAD_GROWTH
    if low in by and high in by:
        a, b = by[low]["load"], by[high]["load"]
        ratio = b["per_rank_s"] / a["per_rank_s"]
        lines.append(f"load per rank from {low} to {high} ranks: x{ratio:.2f} (target <= "
                     f"x{limit:g}): {'MET' if ratio <= limit else 'MISSED'}; its view of the "
                     f"manifest x{b['view_s'] / a['view_s']:.2f}; files it stats "
                     f"{a['files_read']:.0f} -> {b['files_read']:.0f}, of which those of its "
                     f"own tensors {a['files_read_own']:.0f} -> {b['files_read_own']:.0f}")
    worse = [g for g in rows if g["growth"] == "SUPERLINEAR"]
    lines.append("Faster than linear: " + "; ".join(
        f"{g['metric']} ({g['per']}, b={g['last_exponent']:.2f})" for g in worse) + "."
        if worse else "Nothing measured grows faster than linearly in the ranks.")
    per_rank = [g for g in rows if g["per"] == "per rank" and g["growth"] in ("linear",
                                                                                "SUPERLINEAR")]
    lines.append("Per rank, growing with the ranks: " + "; ".join(
        f"{g['metric']} (b={g['last_exponent']:.2f})" for g in per_rank) + "."
        if per_rank else "Per rank, nothing grows linearly or faster with the ranks.")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", help=f"rank counts [{','.join(map(str, FULL_RANKS))}]")
    ap.add_argument("--quick", action="store_true",
                    help=f"rank counts {','.join(map(str, QUICK_RANKS))} (about a minute of "
                    "CPU; seconds with a small model, as its unit test runs it)")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=8)
    ap.add_argument("--layers", type=int, default=Model.layers)
    ap.add_argument("--d-model", type=int, default=Model.d_model)
    ap.add_argument("--vocab", type=int, default=Model.vocab)
    ap.add_argument("--samples", type=int, default=3,
                    help="ranks whose load is simulated and timed [3]")
    ap.add_argument("--dir", default=DEFAULT_DIR,
                    help=f"where the simulated root goes [{DEFAULT_DIR}: the storage is not "
                    "what is measured here, benchmarks/ckpt_bench.py measures it]")
    ap.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    args = ap.parse_args(argv)
    ranks = ([int(x) for x in args.ranks.split(",")] if args.ranks
             else list(QUICK_RANKS if args.quick else FULL_RANKS))
    model = Model(args.layers, args.d_model, args.vocab)
    print(f"Simulated saves: GPT {model.layers} layers, d_model {model.d_model}, vocab "
          f"{model.vocab}; tp={args.tp}, pp={args.pp}, dp = ranks / {args.tp * args.pp}; "
          f"bf16 parameters, fp32 AdamW state; root under {args.dir}")
    results = []
    started = time.perf_counter(), clock()
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
    print("\nSummary")
    for line in lines:
        print(f"- {line}")
    took = {"wall_s": time.perf_counter() - started[0], "cpu_s": clock() - started[1]}
    print(f"\nthe simulation took {took['wall_s']:.0f} s ({took['cpu_s']:.0f} s CPU)")
    print("\nAs docs/scale.md's table (CPU time):\n")
    print(markdown_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"model": dataclasses.asdict(model), "tp": args.tp, "pp": args.pp,
             "gpus_per_node": GPUS_PER_NODE, "drives": DRIVES, "stands_in": STANDS_IN,
             "results": results, "by_ranks": {str(r["ranks"]): r for r in results},
             "growth": rows, "summary": lines, "took": took}, indent=1))
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
