"""``hpctrain ckpt list|verify|prune`` end to end through the installed command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.ckpt import make_state, run_cli


@pytest.fixture
def root(tmp_path: Path) -> Path:
    import importlib.util

    from helpers.prereq import require

    # torch only creates the fixture data; the commands under test never import it
    require(importlib.util.find_spec("torch") is not None, "python package 'torch'")
    from hpctrain.checkpoint import CheckpointManager

    with CheckpointManager(tmp_path, keep_last=10) as mgr:
        for step in (100, 200, 300, 400):
            mgr.save(step, make_state(step, rows=8))
    return tmp_path


def test_list_json_and_table(root: Path) -> None:
    out = run_cli("ckpt", "list", str(root), "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["step"] for r in rows] == [100, 200, 300, 400]
    assert all(r["valid"] and r["world_size"] == 1 and r["bytes"] > 8 * 256 * 4 for r in rows)
    table = run_cli("ckpt", "list", str(root))
    assert table.returncode == 0 and table.stdout.count(" ok\n") == 4


def test_list_does_not_import_torch(root: Path) -> None:
    code = ("import sys; from hpctrain.cli import main; "
            f"rc = main(['ckpt', 'list', {str(root)!r}, '--json']); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    code = code.replace("'list'", "'verify'").replace(", '--json'", "")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def test_verify_names_the_bad_file(root: Path) -> None:
    bad = root / "step_000000300" / "rank00000.extra.pkl"
    data = bytearray(bad.read_bytes())
    data[10] ^= 0xFF
    bad.write_bytes(bytes(data))
    out = run_cli("ckpt", "verify", str(root))
    assert out.returncode == 1
    assert f"step 300: {bad}: checksum mismatch" in out.stdout
    listed = json.loads(run_cli("ckpt", "list", str(root), "--json", "--verify").stdout)
    assert [r["valid"] for r in listed] == [True, True, False, True]
    bad_step = run_cli("ckpt", "verify", str(root), "--step", "7")
    assert bad_step.returncode == 5 and "no checkpoint for step 7" in bad_step.stderr


def test_prune_keeps_newest(root: Path) -> None:
    out = run_cli("ckpt", "prune", str(root), "--keep", "2")
    assert out.returncode == 0 and "[100, 200]" in out.stdout
    assert sorted(n for n in os.listdir(root) if n.startswith("step_")) == [
        "step_000000300", "step_000000400"]
    assert "nothing to delete" in run_cli("ckpt", "prune", str(root), "--keep", "2").stdout


def test_bad_input_is_named(tmp_path: Path) -> None:
    out = run_cli("ckpt", "list", str(tmp_path / "missing"))
    assert out.returncode == 5 and "does not exist" in out.stderr
    out = run_cli("ckpt", "prune", str(tmp_path), "--keep", "0")
    assert out.returncode != 0 and "--keep" in out.stderr


def test_verify_of_a_directory_without_checkpoints_is_an_error(root: Path,
                                                              tmp_path_factory) -> None:
    """Issue 43: `verify && delete-the-backup` must not go ahead on an empty directory or
    on the parent of the real root ("0 checkpoint(s) verified", exit 0, before)."""
    empty = tmp_path_factory.mktemp("empty")
    out = run_cli("ckpt", "verify", str(empty))
    assert out.returncode == 5 and f"no checkpoint in {empty}: nothing was verified" in \
        out.stderr, out.stderr
    parent = tmp_path_factory.mktemp("parent")
    shutil.copytree(root, parent / "ckpt")
    (parent / "logs").mkdir()
    out = run_cli("ckpt", "verify", str(parent))
    assert out.returncode == 5 and f"(checkpoints are in {parent / 'ckpt'})" in out.stderr, \
        out.stderr
    assert run_cli("ckpt", "verify", str(parent / "ckpt")).returncode == 0
