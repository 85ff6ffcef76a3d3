"""Code snapshots and provenance: which files, the content id, the copy and its modes,
the spec as it runs from the copy, and what the job folder records."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobs.provenance import environment_facts, provenance, write_provenance
from hpctrain.jobs.snapshot import Origin, materialize, scan, walk
from hpctrain.jobs.submit import freeze
from hpctrain.render.script import render
from hpctrain.spec.model import JobSpec


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('v1')\n")
    (root / "pkg" / "model.py").write_text("W = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / ".gitignore").write_text("data/\n*.log\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "init")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 1000)
    (root / "out.log").write_text("noise\n")
    (root / "notes.py").write_text("# new, not committed yet\n")
    (root / "train.py").write_text("print('v2')\n")
    return root


def test_git_tree_sends_tracked_and_unignored_files(repo: Path) -> None:
    source = scan(repo)
    assert source.paths == [".gitignore", "notes.py", "pkg/model.py", "run.sh", "train.py"]
    assert source.git["dirty"] and source.git["untracked"] == ["notes.py"]
    assert "-print('v1')" in source.git["diff"] and len(source.git["commit"]) == 40
    assert {e.path: e.kind for e in source.entries}["run.sh"] == "x"


def test_id_names_the_content(repo: Path) -> None:
    first = scan(repo).id
    assert scan(repo).id == first and len(first) == 12
    (repo / "train.py").write_text("print('v3')\n")
    assert scan(repo).id != first
    (repo / "train.py").write_text("print('v2')\n")
    assert scan(repo).id == first
    (repo / "train.py").chmod(0o755)            # the x bit is part of what runs
    assert scan(repo).id != first


def test_outside_git_skips_caches_and_hpctrainignore(tmp_path: Path) -> None:
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "step.bin").write_text("")
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.pyc").write_text("")
    (tmp_path / ".hpctrainignore").write_text("# data\nckpt/\n")
    assert walk(tmp_path) == [".hpctrainignore", "a.py"]


def test_too_big_is_refused_naming_the_largest(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 3 * 2**20)
    (tmp_path / "a.py").write_text("")
    with pytest.raises(SpecError, match=r"would copy 3 MiB \(limit 1 MiB\), largest: "
                                        r"weights.bin \(3 MiB\).*snapshot = false"):
        scan(tmp_path, max_bytes=2**20)


def test_paths_that_leave_the_root_are_refused(tmp_path: Path) -> None:
    for bad in ("../etc/passwd", "/etc/passwd", "a/../../x"):
        with pytest.raises(SpecError, match="leaves"):
            scan(tmp_path, paths=[bad])


def test_materialize_copies_once_private_keeping_x(repo: Path, tmp_path: Path) -> None:
    os.umask(0)
    source = scan(repo)
    (repo / "link").symlink_to("train.py")
    folder = tmp_path / "jobs" / "name"
    folder.mkdir(parents=True, mode=0o700)
    where = materialize(source, folder, "private")
    assert where == folder / "snapshots" / source.id
    assert (where / "train.py").read_text() == "print('v2')\n"
    assert oct((where / "run.sh").stat().st_mode & 0o777) == "0o700"
    assert oct((where / "train.py").stat().st_mode & 0o777) == "0o600"
    assert oct(where.stat().st_mode & 0o777) == "0o700"
    assert oct((where / "pkg").stat().st_mode & 0o777) == "0o700"
    assert not (where / "data").exists() and not (where / "out.log").exists()
    (repo / "train.py").write_text("edited after submission\n")
    assert materialize(source, folder, "private") == where          # reused, not redone
    assert (where / "train.py").read_text() == "print('v2')\n"
    assert [p.name for p in (folder / "snapshots").iterdir()] == [source.id]   # no leftovers
    os.umask(0o022)


def test_group_level_modes(repo: Path, tmp_path: Path) -> None:
    where = materialize(scan(repo), tmp_path, "group")
    assert oct((where / "run.sh").stat().st_mode & 0o777) == "0o750"
    assert oct((where / "train.py").stat().st_mode & 0o777) == "0o640"


def test_origin_checks_the_clients_id(repo: Path) -> None:
    source = scan(repo)
    origin = Origin(str(repo), git={"commit": "abc"}, expect_id=source.id,
                    files=tuple(source.paths))
    assert origin.scan().id == source.id and origin.scan().git == {"commit": "abc"}
    (repo / "pkg" / "model.py").write_text("W = 2\n")
    with pytest.raises(SpecError, match=f"the client sent {source.id}: a file changed"):
        origin.scan()


def spec(**run) -> JobSpec:
    return JobSpec.from_dict({"name": "snap", "partition": "debug", "time": "00:10:00",
                              "run": {"command": ["python", "train.py"], **run}})


def test_spec_snapshot_is_a_bool() -> None:
    assert spec().run.snapshot is None and spec(snapshot=True).run.snapshot is True
    with pytest.raises(SpecError, match="run.snapshot='yes' must be true or false"):
        spec(snapshot="yes")
    assert JobSpec.from_dict(spec(snapshot=False).to_dict()).run.snapshot is False


def test_frozen_spec_runs_from_its_snapshot(repo: Path, tmp_path: Path) -> None:
    folder = tmp_path / "jobs" / "snap"
    frozen = freeze(spec(snapshot=True), folder, Origin(str(repo)), write=False)
    sid, where = frozen.snapshot
    assert where == str(folder / "snapshots" / sid) and not Path(where).exists()
    assert frozen.spec.workdir == where
    assert frozen.spec.output == f"{folder}/hpctrain-%x-%j.out"
    script = render(frozen.spec, snapshot=frozen.snapshot).script
    assert f"#SBATCH --chdir={where}\n" in script
    assert f"export HPCTRAIN_SNAPSHOT_ID={sid}\n" in script
    # off unless asked, or unless the submission path's default says so
    assert freeze(spec(), folder, Origin(str(repo)), write=False).snapshot is None
    assert freeze(spec(), folder, Origin(str(repo)), default=True, write=False).snapshot
    assert freeze(spec(snapshot=False), folder, Origin(str(repo)), default=True,
                  write=False).snapshot is None


def test_provenance_files(repo: Path, tmp_path: Path) -> None:
    source = scan(repo)
    prov = provenance(source, tmp_path / "snapshots" / source.id, submitted_from="a@laptop:/p")
    written = write_provenance(tmp_path, "123", prov, "private")
    assert [p.name for p in written] == ["123_provenance.json", "123_requirements.txt",
                                         "123_git.diff"]
    data = json.loads(written[0].read_text())
    assert data["snapshot_id"] == source.id and data["git"]["dirty"] is True
    assert "diff" not in data["git"] and data["submitted_from"] == "a@laptop:/p"
    assert data["environment"]["torch"].startswith("2.") and "python" in data["environment"]
    assert "click==" in written[1].read_text()
    assert "+print('v2')" in written[2].read_text()
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in written)


def test_environment_facts_do_not_import_torch() -> None:
    code = ("import sys; from hpctrain.jobs.provenance import environment_facts as f; "
            "d = f(); assert d['torch'] and 'torch' not in sys.modules, d; print(d['cuda'])")
    out = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert environment_facts()["cuda"] == ""     # the CPU build here
