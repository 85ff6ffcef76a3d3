"""The manifest (format 5: a head and every rank's record; and formats 1-4), checksums
and retention: pure logic, no torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.ckpt import one_file
from hpctrain.checkpoint.commit import manifest_files
from hpctrain.checkpoint.manifest import (MANIFEST, RANKS, ExtrasEntry, FileRecord, Manifest,
                                          RankRecords, TensorEntry, parse, parse_part,
                                          parse_step_dirname, step_dirname)
from hpctrain.checkpoint.reader import read_manifest, read_rank_view, verify_file, verify_step
from hpctrain.checkpoint.retention import select_deletions
from hpctrain.errors import CheckpointCorrupt, CheckpointError
import zlib


def _manifest(files: list[FileRecord]) -> Manifest:
    return Manifest(step=12, world_size=1, files=files, tensors=[], extras=[],
                    layout={"kind": "torch"}, versions={"torch": "x"}, created=1.0,
                    parts=[RankRecords(files=files)])


def _write(step_dir: Path, m: Manifest) -> Path:
    """The step's manifest files, as the commit writes them (format 5)."""
    step_dir.mkdir(exist_ok=True)
    for name, data in manifest_files(m).items():
        (step_dir / name).write_bytes(data)
    return step_dir


def test_step_dirnames_sort_numerically_and_round_trip() -> None:
    names = [step_dirname(s) for s in (5, 1200, 40, 999_999_999, 1_000_000_000)]
    # below 10**9 `ls` order is step order; the code itself always sorts numerically
    assert sorted(names[:4], key=parse_step_dirname) == sorted(names[:4])
    assert [parse_step_dirname(n) for n in names] == [5, 1200, 40, 999_999_999, 1_000_000_000]
    assert step_dirname(1200) == "step_000001200"
    for other in (".tmp-step_000000001", ".trash-step_000000001.ab", "latest", "step_12"):
        assert parse_step_dirname(other) is None


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, None])
def test_bad_step_is_refused_with_the_value(bad: object) -> None:
    with pytest.raises(CheckpointError, match=repr(bad).replace("(", r"\(").replace(".", r"\.")):
        step_dirname(bad)  # type: ignore[arg-type]


def test_manifest_round_trips(tmp_path: Path) -> None:
    m = _manifest([FileRecord("rank00000.bin", 10, [(0, 4, 1), (4, 6, 2)])])
    back = read_manifest(_write(tmp_path / "s", m))
    assert back.files == m.files and back.total_bytes == 10 and back.parts == m.parts
    assert parse(m.dumps()).ranks == m.ranks == back.ranks


def _with_entries() -> Manifest:
    """Two ranks: a shard each, and each its own RNG state; rank 1's extras differ."""
    files = [[FileRecord(f"rank{r:05d}.bin", 16, [(0, 8, 11 + r), (8, 8, 13 + r)]),
              FileRecord(f"rank{r:05d}.extra.pkl", 3, [(0, 3, 20 + r)])] for r in range(2)]
    tensors = [[TensorEntry(["model", "w", 0], "float32", [4], [2 * r], [2], True,
                            f"rank{r:05d}.bin", 0, 8, 11 + r),
                TensorEntry(["rng"], "uint8", [8], [0], [8], False, f"rank{r:05d}.bin", 8, 8,
                            13 + r, rank=r)] for r in range(2)]
    extras = [[ExtrasEntry(r, f"rank{r:05d}.extra.pkl", [["extra", "seed"]])] for r in range(2)]
    parts = [RankRecords(files[r], tensors[r], extras[r]) for r in range(2)]
    return Manifest(step=12, world_size=2, files=files[0] + files[1],
                    tensors=tensors[0] + tensors[1], extras=extras[0] + extras[1],
                    layout={"kind": "torch"}, versions={"torch": "x"}, created=1.0,
                    per_rank=[["rng"]], own=[["extra", "seed"]], parts=parts)


def test_format_5_keeps_each_ranks_entries_in_its_own_record(tmp_path: Path) -> None:
    m = _with_entries()
    step = _write(tmp_path / "s", m)
    head = json.loads((step / MANIFEST).read_text())
    assert head["format_version"] == 5 and head["checksum"] == "crc32"
    # the head: the shared entries (sums under "sum"), the per-rank paths, no rank's files
    assert [t["path"] for t in head["tensors"]] == [["model", "w", 0]] * 2
    assert all("sum" in t and "crc32" not in t and "rank" not in t for t in head["tensors"])
    assert head["files"] == [] and "extras" not in head
    assert head["per_rank"] == [["rng"]] and head["own"] == [["extra", "seed"]]
    assert head["ranks"]["name"] == RANKS and head["ranks"]["size"] == (step / RANKS).stat().st_size
    # a rank's view: the head, its record; the whole manifest: every record
    view = read_rank_view(step, 1)
    assert [f.name for f in view.files] == ["rank00001.bin", "rank00001.extra.pkl"]
    assert [(t.path, t.rank) for t in view.tensors] == [(["model", "w", 0], None)] * 2 \
        + [(["rng"], 1)]
    assert [e.rank for e in view.extras] == [1] and view.own == [["extra", "seed"]]
    assert read_rank_view(step, 5).extras == m.extras[:1]   # the world grew: rank 0's extras
    whole = read_manifest(step)
    assert sorted(map(repr, whole.tensors)) == sorted(map(repr, m.tensors))
    assert whole.files == m.files and whole.extras == m.extras and whole.world_size == 2


def test_a_damaged_record_is_found_by_the_rank_that_reads_it(tmp_path: Path) -> None:
    step = _write(tmp_path / "s", _with_entries())
    data = bytearray((step / RANKS).read_bytes())
    data[-5] ^= 0x20                      # in rank 1's record, the last one
    (step / RANKS).write_bytes(bytes(data))
    assert read_rank_view(step, 0).extras[0].rank == 0
    with pytest.raises(CheckpointCorrupt, match=r"manifest.ranks: rank 1's record does not "
                       "match its sum"):
        read_rank_view(step, 1)
    (problem,) = verify_step(step)
    assert "manifest.ranks does not match" in problem
    data[:8] = b"HPCRANKZ"
    (step / RANKS).write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match="header is not that of 2 ranks"):
        read_rank_view(step, 0)
    (step / RANKS).unlink()
    with pytest.raises(CheckpointCorrupt, match="cannot read .*manifest.ranks"):
        read_rank_view(step, 0)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_one_file_versions_still_parse(version: int) -> None:
    """What 0.1 to 0.7 wrote: every entry in manifest.json; before 4 the sums under crc32."""
    m = _with_entries()
    raw = one_file(m, version)
    back = parse(json.dumps(raw))
    assert back.ranks is None and back.tensors == m.tensors and back.extras == m.extras
    assert back.per_rank == [["rng"]] and back.own == [["extra", "seed"]]   # computed
    if version < 4:
        with pytest.raises(CheckpointError, match=r"tensor \['model', 'w', 0\]: crc32"):
            parse(json.dumps({**raw, "tensors": one_file(m)["tensors"]}))


def test_version_4_without_its_sum_key_is_refused() -> None:
    raw = one_file(_with_entries())
    raw["tensors"][1]["crc32"] = raw["tensors"][1].pop("sum")
    with pytest.raises(CheckpointError, match=r"tensor \['rng'\]: sum"):
        parse(json.dumps(raw))


@pytest.mark.parametrize("mutate, message", [
    (lambda j: j.update(format="other"), "format"),
    (lambda j: j.update(format_version=99), "upgrade hpctrain"),
    (lambda j: j.update(step=-3), "step"),
    (lambda j: j["files"][0].update(name="../evil"), "relative path"),
    (lambda j: j["files"][0].update(blocks=[[0, 4, 1], [5, 5, 2]]), "gap"),
    (lambda j: j["files"][0].update(size=11), "cover 10 bytes of 11"),
    (lambda j: j.update(tensors=[{"path": ["w"]}]), "tensor"),
    (lambda j: j.update(tensors=[{"path": ["w"], "dtype": "float32", "global_shape": [1],
                                  "offsets": [0], "shape": [1], "file": "x.bin", "offset": 0,
                                  "nbytes": 4, "sum": 1}]), "unknown file 'x.bin'"),
    (lambda j: j.update(extras=[{"rank": 0, "file": "rank00000.bin", "own": "seed"}]),
     "extras entry"),
])
def test_invalid_manifests_are_named(mutate, message: str) -> None:
    raw = one_file(_manifest([FileRecord("rank00000.bin", 10, [(0, 4, 1), (4, 6, 2)])]))
    mutate(raw)
    with pytest.raises(CheckpointError, match=message):
        parse(json.dumps(raw), where="m.json")


@pytest.mark.parametrize("mutate, message", [
    (lambda j: j.pop("ranks"), "file entry None"),
    (lambda j: j.update(per_rank="rng"), "per_rank/own lists"),
    (lambda j: j["ranks"].update(size=3), "cover"),
])
def test_an_invalid_format_5_head_is_named(mutate, message: str) -> None:
    m = _with_entries()
    manifest_files(m)
    raw = json.loads(m.dumps())
    mutate(raw)
    with pytest.raises(CheckpointError, match=message):
        parse(json.dumps(raw), where="m.json")


def test_a_record_that_claims_another_ranks_entries_is_refused() -> None:
    part = json.dumps(_with_entries().parts[1].to_json()).encode()
    assert parse_part(part, 1, "r").tensors[0].rank == 1
    with pytest.raises(CheckpointError, match=r"rank 0's tensor \['rng'\]: rank 1"):
        parse_part(part, 0, "r")


def test_truncated_manifest_json_is_a_clear_error() -> None:
    m = _manifest([])
    manifest_files(m)
    data = m.dumps()
    with pytest.raises(CheckpointError, match="not valid JSON"):
        parse(data[: len(data) // 2])


def test_verify_file_finds_flipped_byte_and_truncation(tmp_path: Path) -> None:
    data = bytes(range(256)) * 100
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    rec = FileRecord("f.bin", len(data), [(0, 1000, zlib.crc32(data[:1000])),
                                          (1000, len(data) - 1000, zlib.crc32(data[1000:]))])
    assert verify_file(path, rec) is None
    flipped = bytearray(data)
    flipped[5000] ^= 0x01
    path.write_bytes(flipped)
    assert "checksum mismatch in bytes [1000, 25600)" in verify_file(path, rec)
    path.write_bytes(data[:-1])
    assert "truncated" in verify_file(path, rec)


def test_verify_step_without_manifest_says_interrupted(tmp_path: Path) -> None:
    (problem,) = verify_step(tmp_path)
    assert "manifest.json is missing" in problem and "interrupted" in problem


steps = st.lists(st.integers(0, 500), unique=True, max_size=30)


@given(steps, st.data(), st.integers(1, 5), st.one_of(st.none(), st.integers(1, 50)))
def test_retention_invariants(committed: list[int], data, keep_last: int,
                              keep_every: int | None) -> None:
    valid = data.draw(st.lists(st.sampled_from(committed), unique=True) if committed
                      else st.just([]))
    gone = select_deletions(committed, valid, keep_last, keep_every)
    assert set(gone) <= set(committed)
    if valid:
        newest = max(valid)
        assert newest not in gone
        assert all(s < newest for s in gone)
        kept_valid = sorted(set(valid) - set(gone))
        assert kept_valid[-min(keep_last, len(valid)):] == sorted(valid)[-keep_last:]
        if keep_every:
            assert not [s for s in gone if s % keep_every == 0 and s in valid]
    else:
        assert gone == []


def test_retention_example_keep_last_and_every() -> None:
    committed = list(range(100, 1100, 100))
    assert select_deletions(committed, committed, 2, 500) == [100, 200, 300, 400, 600, 700, 800]


@pytest.mark.parametrize("keep_last, keep_every", [(0, None), (2, 0), ("3", None)])
def test_bad_retention_policy_is_refused(keep_last, keep_every) -> None:
    with pytest.raises(ValueError, match="keep_"):
        select_deletions([1], [1], keep_last, keep_every)
