"""The package installs and finds its templates from a source checkout and from a wheel."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from hpctrain.spec.site import builtin_templates_dir

ROOT = Path(__file__).resolve().parents[2]


def test_templates_found_from_source_checkout() -> None:
    assert builtin_templates_dir() == ROOT / "templates"


def test_every_subpackage_is_listed_in_setup_cfg() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    on_disk = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "hpctrain").rglob("__init__.py")}
    assert on_disk - listed == set(), "add these to [options] packages in setup.cfg"


@pytest.mark.slow
def test_wheel_installs_into_fresh_venv_and_finds_templates(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    # built from a copy: setuptools writes build/ beside the sources, and the checkout may
    # not be writable by whoever runs the tests (./dev.sh test runs them as a plain user)
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels), str(src)], check=True, timeout=300)
    (wheel,) = wheels.glob("hpctrain-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True,
                   timeout=300)
    # Dependencies (click, jinja2, ...) come from this interpreter's site-packages; hpctrain
    # itself must come from the fresh venv (an editable install is not on PYTHONPATH).
    deps = sysconfig.get_paths()["purelib"]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {**os.environ, "PYTHONPATH": deps}
    code = ("import hpctrain, hpctrain.spec.site as r, hpctrain.spec.partitions as p; "
            "print(hpctrain.__file__); print(r.builtin_templates_dir()); "
            "print(','.join(x.name for x in p.partitions_in([r.devcluster_templates_dir()])))")
    out = subprocess.run([py, "-c", code], cwd=outside, env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout.splitlines()
    assert out[0].startswith(str(env_dir)), out
    assert out[1].startswith(str(env_dir)) and out[1].endswith("hpctrain/templates"), out
    assert {"debug", "urgent"} <= set(out[2].split(","))
    listing = subprocess.run([env_dir / "bin" / "hpctrain", "templates", "list"], cwd=outside,
                             env=env, capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "debug" in listing.stdout and "urgent" in listing.stdout
