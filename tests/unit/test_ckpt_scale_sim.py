"""benchmarks/ckpt_scale_sim.py at 8 and 32 ranks (a few seconds): the simulated saves run
hpctrain's own plan, manifest and load code, so what they commit must be a sound checkpoint
of every simulated rank's state, and the plan the one the rule gives; this keeps the
benchmark from rotting and its figures honest.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pickle
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "ckpt_scale_sim.py"
TINY = {"layers": 4, "d_model": 64, "vocab": 128, "seq": 32}   # 2 layers a stage at pp=2


@pytest.fixture(scope="module")
def sim_mod() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ckpt_scale_sim", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sims(sim_mod: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """tp=2 x pp=2, dp 2 and 8; and 32 ranks with twice the tp shards (tp=4)."""
    model = sim_mod.Model(**TINY)
    out = {}
    for name, world, tp in (("8", 8, 2), ("32", 32, 2), ("32-tp4", 32, 4)):
        out[name] = sim_mod.simulate(world, tmp_path_factory.mktemp(f"sim{name}"), tp=tp,
                                     pp=2, model=model, samples=3)
    return out


def _key(entry) -> tuple:
    return tuple(entry.path), tuple(entry.offsets)


@pytest.mark.parametrize("name", ["8", "32", "32-tp4"])
def test_the_manifest_lists_every_ranks_shards_exactly_once(sims: dict, name: str) -> None:
    sim = sims[name]
    man, world, owner = sim.manifest, sim.layout.world, sim.coordinator.plan.owner
    assert man.world_size == world
    # each rank's two files, once each; one extras entry per rank
    names = Counter(f.name for f in man.files)
    assert names == Counter([f"rank{r:05d}.bin" for r in range(world)]
                            + [f"rank{r:05d}.extra.pkl" for r in range(world)])
    assert sorted(e.rank for e in man.extras) == list(range(world))
    entries = Counter((_key(t), t.rank) for t in man.tensors)
    assert max(entries.values()) == 1, "an entry listed twice"
    listed = {(_key(t), t.rank): t for t in man.tensors}
    expected = set()
    for rank, chunks in enumerate(sim.chunks):
        final, _ = sim.finals[rank]
        for c in chunks:
            if c.key() in final.per_rank:   # each holder's own value, in its own file
                entry = listed[(c.key(), rank)]
                assert entry.file == f"rank{rank:05d}.bin"
                expected.add((c.key(), rank))
            else:                           # shared: once, by its owner, who holds it
                entry = listed[(c.key(), None)]
                assert entry.file == f"rank{owner[c.key()]:05d}.bin"
                assert c.key() in {k.key() for k in sim.chunks[owner[c.key()]]}
                expected.add((c.key(), None))
            assert entry.nbytes == c.nbytes and entry.sharded == c.sharded
    assert set(listed) == expected, "an entry no rank holds"
    # every shared tensor's boxes tile it exactly (DTensor shards over tp)
    volume: dict[tuple, int] = {}
    for t in man.tensors:
        if t.rank is None:
            volume[tuple(t.path)] = volume.get(tuple(t.path), 0) + math.prod(t.shape)
    assert all(volume[tuple(t.path)] == math.prod(t.global_shape)
               for t in man.tensors if t.rank is None)
    # the only value that differs by rank is each rank's RNG state; the head says so
    assert {k[0] for final, _ in sim.finals for k in final.per_rank} == {("rng", "torch")}
    assert sum(1 for t in man.tensors if t.rank is not None) == world
    assert man.per_rank == [["rng", "torch"]]
    # extras: each dp rank's data position, each stage's parameter names
    assert man.own == [["data", "dp_rank"], ["data", "position"], ["optim", "param_groups"]]


def test_the_manifest_grows_with_the_shard_count(sims: dict) -> None:
    small, large, more_tp = (sims[n].figures["load"] for n in ("8", "32", "32-tp4"))
    assert small["files"] == 16 and large["files"] == 64
    # more ranks: more files, per-rank entries and extras, so more bytes; in the records,
    # not in the head every loading rank reads
    assert small["tensor_entries"] < large["tensor_entries"]
    assert small["manifest_bytes"] < large["manifest_bytes"]
    assert large["head_bytes"] == len(sims["32"].manifest_bytes)
    assert abs(small["head_bytes"] - large["head_bytes"]) < 0.01 * large["head_bytes"]
    # the same ranks, the layers split in twice as many tp shards: more entries, more bytes
    assert large["tensor_entries"] < more_tp["tensor_entries"]
    assert large["head_bytes"] < more_tp["head_bytes"]


@pytest.mark.parametrize("name", ["8", "32"])
def test_the_plan_is_the_rules_and_is_reused(sim_mod: ModuleType, sims: dict,
                                             name: str) -> None:
    from hpctrain.checkpoint.manifest import parse
    from hpctrain.checkpoint.replicas import plan_writes

    sim = sims[name]
    # ranks grouped by structure plan as every rank alone would (tp x pp groups here)
    items = [[(c.key(), c.nbytes, c.sharded) for c in chunks] for chunks in sim.chunks]
    alone = plan_writes([(held, [r]) for r, held in enumerate(items)])
    assert alone == sim.coordinator.plan
    assert len(sim.coordinator.ranks) == sim.layout.tp * sim.layout.pp
    # each rank's part: what it owns, and nothing it does not hold
    for rank, (plan, (final, _)) in enumerate(zip(sim.plans, sim.finals)):
        mine = {key for key, _, _ in items[rank]}
        assert plan.first == {k for k in mine if alone.owner.get(k) == rank}
        assert final.first == plan.first and final.per_rank <= mine
    # the later save reused every rank's plan (one all-reduce) and found the same own values
    assert [again for again, _ in sim.later] == [final for final, _ in sim.finals]
    assert sim.figures["later_save"]["bytes_in"] < 200
    # the head on disk is the whole manifest's head, and parses back into it
    assert sim.manifest.dumps() == sim.manifest_bytes
    head = parse(sim.manifest_bytes)
    assert head.tensors == [t for t in sim.manifest.tensors if t.rank is None]
    assert head.ranks == sim.manifest.ranks and head.per_rank == sim.manifest.per_rank


def test_the_fake_collective_hands_rank_0_every_contribution(sim_mod: ModuleType) -> None:
    coll = sim_mod.FakeCollective("test", 3)
    comm = sim_mod.FakeComm(0, 3, coll)
    coll.record(2, {"rank": 2})
    with pytest.raises(AssertionError, match=r"no contribution from ranks \[1\]"):
        comm.gather({"rank": 0})
    coll.record(1, {"rank": 1})
    assert comm.gather({"rank": 0}) == [{"rank": r} for r in range(3)]
    fig = coll.figures()
    assert fig["recv_bytes_rank0"] == 3 * (len(pickle.dumps({"rank": 0}, protocol=5)) + 8)


def test_the_quick_tier_prints_its_tables_and_writes_the_figures(
        sim_mod: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The --quick tier's rank counts (64, 256, 1,024), on the tiny model: a few seconds."""
    out = tmp_path / "sim.json"
    assert sim_mod.main(["--quick", "--tp", "2", "--pp", "2", "--layers", "4",
                         "--d-model", "64", "--vocab", "128", "--dir", str(tmp_path),
                         "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    for heading in ("Save plan, per rank", "Commit (rank 0", "Load, per rank",
                    "Growth with the rank count", "Summary", "the simulation took"):
        assert heading in printed
    table = printed.split("As docs/scale.md's table (CPU time):\n\n", 1)[1].splitlines()
    rows = [line for line in table if line.startswith("|")]
    assert rows[1] == "|---|---|---|---|---|---|---|" and len(rows) == 2 + 3
    assert rows[4].startswith("| 1,024 (256) | ") and all(r.count("|") == 8 for r in rows)
    data = json.loads(out.read_text())
    assert [r["ranks"] for r in data["results"]] == [64, 256, 1024]
    for fields in data["by_ranks"].values():   # the names
        assert fields["first_save"]["plan_s"] > 0 and fields["first_save"]["bytes_in"] > 0
        assert fields["later_save"]["plan_s"] > 0 and fields["later_save"]["bytes_in"] > 0
        assert fields["load"]["per_rank_s"] > 0
    assert {g["metric"] for g in data["growth"]} == {m[0] for m in sim_mod.METRICS}
    files = next(g for g in data["growth"] if g["path"] == "load.files")
    assert files["values"] == [128, 512, 2048] and files["growth"] == "linear"
    later = next(g for g in data["growth"] if g["path"] == "later_save.bytes_in")
    assert later["growth"] == "flat"   # what a rank receives does not grow with the ranks
    assert any("later_save.plan_s" in line and "MET" in line for line in data["summary"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ckpt-")], "left behind"
