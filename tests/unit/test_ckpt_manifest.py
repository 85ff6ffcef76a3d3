"""The manifest, checksums and retention: pure logic, no torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.checkpoint.reader import verify_file, verify_step
from hpctrain.checkpoint.manifest import (ExtrasEntry, FileRecord, Manifest, TensorEntry, parse,
                                          parse_step_dirname, step_dirname)
from hpctrain.checkpoint.retention import select_deletions
from hpctrain.errors import CheckpointError
import zlib


def _manifest(files: list[FileRecord]) -> Manifest:
    return Manifest(step=12, world_size=1, files=files, tensors=[], extras=[],
                    layout={"kind": "torch"}, versions={"torch": "x"}, created=1.0)


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


def test_manifest_round_trips() -> None:
    m = _manifest([FileRecord("rank00000.bin", 10, [(0, 4, 1), (4, 6, 2)])])
    back = parse(m.dumps())
    assert back.to_json() == m.to_json()
    assert back.total_bytes == 10


def _with_entries() -> Manifest:
    m = _manifest([FileRecord("rank00000.bin", 16, [(0, 8, 11), (8, 8, 12)]),
                   FileRecord("rank00000.extra.pkl", 3, [(0, 3, 13)])])
    m.tensors = [TensorEntry(["model", "w", 0], "float32", [4], [0], [2], True,
                             "rank00000.bin", 0, 8, 11),
                 TensorEntry(["rng"], "uint8", [8], [0], [8], False, "rank00000.bin", 8, 8, 12,
                             rank=0)]
    m.extras = [ExtrasEntry(0, "rank00000.extra.pkl", [["extra", "seed"]])]
    return m


def test_entries_round_trip_through_version_4_and_its_sum_key() -> None:
    m = _with_entries()
    raw = json.loads(m.dumps())
    assert raw["format_version"] == 4 and raw["checksum"] == "crc32"
    assert [t["sum"] for t in raw["tensors"]] == [11, 12]
    assert not any("crc32" in t for t in raw["tensors"])
    assert "rank" not in raw["tensors"][0] and raw["tensors"][1]["rank"] == 0
    assert raw["extras"] == [{"rank": 0, "file": "rank00000.extra.pkl",
                              "own": [["extra", "seed"]]}]
    back = parse(m.dumps())
    assert back == m and back.to_json() == m.to_json() and back.kind == "torch"


@pytest.mark.parametrize("version", [1, 2, 3])
def test_older_versions_hold_the_sum_under_crc32(version: int) -> None:
    raw = json.loads(_with_entries().dumps())
    raw["format_version"] = version
    for t in raw["tensors"]:
        t["crc32"] = t.pop("sum")
    assert parse(json.dumps(raw)) == _with_entries()
    with pytest.raises(CheckpointError, match=r"tensor \['model', 'w', 0\]: crc32"):
        parse(json.dumps({**raw, "tensors": json.loads(_with_entries().dumps())["tensors"]}))


def test_version_4_without_its_sum_key_is_refused() -> None:
    raw = json.loads(_with_entries().dumps())
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
    raw = _manifest([FileRecord("rank00000.bin", 10, [(0, 4, 1), (4, 6, 2)])]).to_json()
    mutate(raw)
    with pytest.raises(CheckpointError, match=message):
        parse(json.dumps(raw), where="m.json")


def test_truncated_manifest_json_is_a_clear_error() -> None:
    data = _manifest([]).dumps()
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
