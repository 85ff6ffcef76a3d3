"""Checkpoint checksums: crc32c where the CPU computes it, and every older checkpoint
(crc32, no ``checksum`` field) still loads and verifies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hpctrain.checkpoint import CheckpointManager, read_tensors, verify_step
from hpctrain.checkpoint import checksum
from hpctrain.checkpoint.manifest import MANIFEST, parse
from hpctrain.errors import CheckpointError
from helpers.ckpt import as_format, assert_state_is, make_state, run_cli, whole_manifest

OLD = Path(__file__).resolve().parents[1] / "data" / "ckpt-0.2"  # written by hpctrain 0.2.0


def test_the_algorithms_are_the_standard_ones_and_run_incrementally() -> None:
    data = b"123456789"  # the check value of every CRC catalogue
    assert checksum.get("crc32")(data) == 0xCBF43926
    assert checksum.get("crc32c")(data) == 0xE3069283
    for name in checksum.KNOWN:
        fn = checksum.get(name)
        assert fn(data[4:], fn(data[:4])) == fn(data)


def test_this_machine_writes_crc32c_on_the_cpu_instruction() -> None:
    # the bench's figures assume the hardware path; without it crc32 is written instead
    assert checksum.DEFAULT == "crc32c"


def test_unknown_checksum_is_refused_with_the_fix() -> None:
    with pytest.raises(CheckpointError, match="unknown checksum 'md5'.*upgrade hpctrain"):
        checksum.get("md5")
    raw = json.loads((OLD / "step_000000007" / MANIFEST).read_text())
    raw.update(format_version=3, checksum="xxh128")
    with pytest.raises(CheckpointError, match="checksum 'xxh128'.*upgrade hpctrain"):
        parse(json.dumps(raw))


@pytest.fixture
def old_root(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(OLD, root)
    return root


def test_a_checkpoint_written_by_0_2_loads_and_verifies(old_root: Path) -> None:
    step_dir = old_root / "step_000000007"
    manifest = json.loads((step_dir / MANIFEST).read_text())
    assert manifest["versions"]["hpctrain"] == "0.2.0" and "checksum" not in manifest
    assert verify_step(step_dir) == []
    assert run_cli("ckpt", "verify", str(old_root)).returncode == 0
    with CheckpointManager(old_root) as mgr:
        state = make_state(0, rows=8)
        assert mgr.load_latest(state) == 7
        assert_state_is(state, 7)
        # the next save is written with today's checksum beside the old step
        mgr.save(8, make_state(8, rows=8))
    new = whole_manifest(old_root / "step_000000008")
    assert new["format_version"] == 5 and new["checksum"] == "crc32c"
    assert all("sum" in t and "crc32" not in t for t in new["tensors"])
    assert verify_step(old_root / "step_000000008") == []
    assert dict(read_tensors(step_dir))["model.w"].sum() == 7 * 8 * 256


def test_a_flipped_byte_is_found_by_either_algorithm(old_root: Path) -> None:
    with CheckpointManager(old_root) as mgr:
        mgr.save(8, make_state(8, rows=8))
    for step, name in ((7, "crc32"), (8, "crc32c")):
        data = old_root / f"step_{step:09d}" / "rank00000.bin"
        raw = bytearray(data.read_bytes())
        raw[100] ^= 0x10
        data.write_bytes(raw)
        (problem,) = verify_step(data.parent)
        assert "checksum mismatch in bytes [0, 8192)" in problem and f"({name} " in problem
        with CheckpointManager(old_root) as mgr, pytest.raises(CheckpointError, match="checksum"):
            mgr.load(step, make_state(0, rows=8))


def test_a_version_3_checkpoint_loads_verifies_and_exports(tmp_path: Path) -> None:
    """What 0.3 to 0.5 wrote: format 3, CRC-32C sums under the key ``crc32``."""
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(5, make_state(5, rows=8))
    path = tmp_path / "step_000000005" / MANIFEST
    as_format(path.parent, 3)
    assert json.loads(path.read_text())["format_version"] == 3
    assert verify_step(path.parent) == []
    with CheckpointManager(tmp_path) as mgr:
        state = make_state(0, rows=8)
        assert mgr.load_latest(state) == 5
        assert_state_is(state, 5)
    assert dict(read_tensors(path.parent))["model.w"].sum() == 5 * 8 * 256
    data = path.parent / "rank00000.bin"
    damaged = bytearray(data.read_bytes())
    damaged[10] ^= 0x01
    data.write_bytes(damaged)
    with pytest.raises(CheckpointError, match=r"checksum mismatch in bytes \[0, 8192\) "
                                              r"\(tensor \['model', 'w'\]\)"):
        dict(read_tensors(path.parent))
