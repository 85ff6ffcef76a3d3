"""``hpctrain submit`` without a cluster: dry run, bad input, no SLURM client, light imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import cli
from hpctrain.errors import SlurmNotFound
from helpers.jobs import env_without, isolate
from helpers.specs import write_spec

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_prints_plan_and_exactly_the_rendered_script(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    spec = write_spec(tmp_path / "s.toml", nodes=2, gpus=2)
    assert cli.main(["submit", str(spec), "--set", "layout.tp=2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "world=4 = tp 2 x dp 2 x pp 1" in out
    rows = [line.split() for line in out.splitlines()]
    assert ["rank", "node", "pp", "dp", "tp"] in rows
    assert ["3", "1", "0", "1", "1"] in rows   # rank 3: node 1, pp 0, dp 1, tp 1
    assert cli.main(["render", str(spec), "--set", "layout.tp=2"]) == 0
    rendered = capsys.readouterr().out
    assert out.endswith(rendered)
    assert not (tmp_path / "cache" / "jobs.jsonl").exists()   # nothing submitted or recorded


def test_dry_run_json_is_one_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    spec = write_spec(tmp_path / "s.toml")
    assert cli.main(["submit", str(spec), "--dry-run", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["world"] == 1 and data["script"].startswith("#!/bin/bash")


def test_unknown_override_is_refused_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    spec = write_spec(tmp_path / "s.toml")
    assert cli.main(["submit", str(spec), "--set", "nodez=2"]) == 2
    assert "nodez" in capsys.readouterr().err


def test_missing_sbatch_says_no_slurm_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    spec = write_spec(tmp_path / "s.toml")
    monkeypatch.setenv("PATH", env_without("sbatch", tmp_path)["PATH"])
    assert cli.main(["submit", str(spec)]) == SlurmNotFound.exit_code
    assert "no SLURM client on this machine" in capsys.readouterr().err
    assert not list((tmp_path / "work").rglob("*.sh"))


def test_status_without_records_says_how_to_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    assert cli.main(["status"]) == 0
    assert "no hpctrain jobs recorded yet" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["submit", "{spec}", "--dry-run"], ["status"], ["status", "1", "--json"],
    ["logs", "1"], ["sweep", "{spec}", "--grid", "run.env.X=1,2", "--dry-run"], ["cancel", "--help"],
])
def test_commands_import_neither_torch_nor_submitit(tmp_path: Path, argv: list[str]) -> None:
    spec = write_spec(tmp_path / "s.toml")
    code = ("import sys; from hpctrain import cli; rc = cli.main(sys.argv[1:]); "
            "bad = [m for m in ('torch', 'submitit') if m in sys.modules]; "
            "print('IMPORTED', bad); sys.exit(0)")
    env = {"HPCTRAIN_CACHE_DIR": str(tmp_path / "c"), "PATH": "/usr/bin:/bin",
           "SLURM_CONF": "/var/lib/hpctrain/devcluster/etc/slurm.conf"}
    res = subprocess.run([sys.executable, "-c", code, *[a.format(spec=spec) for a in argv]],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert "IMPORTED []" in res.stdout, res.stdout + res.stderr
