"""benchmarks/ckpt_scale_sim.py at 8 and 32 ranks (a few seconds): the simulated save runs
hpctrain's own plan and manifest code, so what it commits must be a sound checkpoint of
every simulated rank's state; this keeps the benchmark from rotting and its figures honest.
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
    man, final, world = sim.manifest, sim.final, sim.layout.world
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
        for c in chunks:
            if c.key() in final.per_rank:   # each holder's own value, in its own file
                entry = listed[(c.key(), rank)]
                assert entry.file == f"rank{rank:05d}.bin"
                expected.add((c.key(), rank))
            else:                           # shared: once, by its owner, who holds it
                entry = listed[(c.key(), None)]
                owner = final.owner[c.key()]
                assert entry.file == f"rank{owner:05d}.bin"
                assert c.key() in {k.key() for k in sim.chunks[owner]}
                expected.add((c.key(), None))
            assert entry.nbytes == c.nbytes and entry.sharded == c.sharded
    assert set(listed) == expected, "an entry no rank holds"
    # every shared tensor's boxes tile it exactly (DTensor shards over tp)
    volume: dict[tuple, int] = {}
    for t in man.tensors:
        if t.rank is None:
            volume[tuple(t.path)] = volume.get(tuple(t.path), 0) + math.prod(t.shape)
            assert volume[tuple(t.path)] <= math.prod(t.global_shape)
    for t in man.tensors:
        if t.rank is None:
            assert volume[tuple(t.path)] == math.prod(t.global_shape), t.path
    # the only value that differs by rank is each rank's RNG state
    assert {k[0] for k in final.per_rank} == {("rng", "torch")}
    assert sum(1 for t in man.tensors if t.rank is not None) == world


def test_the_manifest_grows_with_the_shard_count(sims: dict) -> None:
    small, large, more_tp = (sims[n].figures["manifest"] for n in ("8", "32", "32-tp4"))
    assert small["files"] == 16 and large["files"] == 64
    # more ranks: more files, per-rank entries and extras, so more bytes
    assert small["tensor_entries"] < large["tensor_entries"]
    assert small["bytes"] < large["bytes"] == len(sims["32"].manifest_bytes)
    # the same ranks, the layers split in twice as many tp shards: more entries, more bytes
    assert large["tensor_entries"] < more_tp["tensor_entries"]
    assert large["bytes"] < more_tp["bytes"]


@pytest.mark.parametrize("name", ["8", "32"])
def test_the_plan_round_trips(sim_mod: ModuleType, sims: dict, name: str) -> None:
    from hpctrain.checkpoint.manifest import parse
    from hpctrain.checkpoint.replicas import plan_writes, settle

    sim = sims[name]
    # the fake all_gather handed every rank what each rank put in, in rank order
    for rank, (held, chunks) in enumerate(zip(sim.held, sim.chunks, strict=True)):
        assert sim.contributions[rank][1] == held
        assert held == [(c.key(), c.nbytes, None) for c in chunks]
    # every sampled rank computed this plan; it is the one the gathered lists give
    assert len(sim.sampled) == 3 and plan_writes(sim.held) == sim.plan
    assert pickle.loads(pickle.dumps(sim.plan)) == sim.plan
    # settling kept every provisional owner of a shared value and dropped no value
    assert all(sim.plan.owner[k] == r for k, r in sim.final.owner.items())
    assert set(sim.plan.owner) | sim.plan.per_rank == set(sim.final.owner) | sim.final.per_rank
    assert settle(sim.plan, sim.held) == sim.plan   # sizes alone: nothing differs
    # the manifest on disk parses back into itself
    again = parse(sim.manifest_bytes)
    assert again.to_json() == json.loads(sim.manifest_bytes) == sim.manifest.to_json()
    assert again.dumps() == sim.manifest_bytes


def test_the_fake_collective_stops_a_rank_until_all_are_in(sim_mod: ModuleType) -> None:
    coll = sim_mod.FakeCollective("test", 3)
    coll.stop = False
    comms = [sim_mod.FakeComm(r, 3, coll) for r in range(3)]
    for r in (2, 0):
        with pytest.raises(sim_mod.AtCollective):
            comms[r].all_gather({"rank": r})
    assert comms[1].all_gather({"rank": 1}) == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
    assert comms[0].gather({"rank": 0}) == [{"rank": r} for r in range(3)]
    assert comms[2].gather({"rank": 2}) is None
    with pytest.raises(AssertionError, match="contributed something else"):
        comms[0].all_gather({"rank": 5})
    fig = coll.figures()
    assert fig["recv_bytes_per_receiver"] == 3 * fig["bytes_per_rank_max"]


def test_the_command_prints_its_tables_and_writes_the_figures(
        sim_mod: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "sim.json"
    assert sim_mod.main(["--ranks", "8,16", "--tp", "2", "--pp", "2", "--layers", "4",
                         "--d-model", "64", "--vocab", "128", "--dir", str(tmp_path),
                         "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    for heading in ("Save plan, per rank", "Collectives (fake", "Manifest: entries",
                    "Growth with the rank count", "Summary"):
        assert heading in printed
    data = json.loads(out.read_text())
    assert [r["ranks"] for r in data["results"]] == [8, 16]
    assert {g["metric"] for g in data["growth"]} == {m[0] for m in sim_mod.METRICS}
    files = next(g for g in data["growth"] if g["path"] == "manifest.files")
    assert files["values"] == [16, 32] and files["growth"] == "linear"
    assert data["summary"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ckpt-")], "left behind"
