"""Helpers for the submission/status/sweep tests: an isolated record and job folder."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

SHARED = Path("/var/lib/hpctrain/devcluster/shared")


def isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shared: bool = False) -> Path:
    """Point hpctrain's job record and job folders at fresh dirs; chdir there; return it.

    ``shared``: put the job folders (and the cwd, where logs land) on the devcluster's
    shared storage, as jobs on a real cluster need.
    """
    root = SHARED / f"test-{uuid.uuid4().hex[:10]}" if shared else tmp_path / "work"
    root.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HPCTRAIN_JOBS_DIR", str(root / "jobs"))
    monkeypatch.chdir(root)
    return root


def write_spec(path: Path, *, name: str = "t", nodes: int = 1, gpus: int = 1,
               command: list[str] | None = None, partition: str = "debug", extra: str = "",
               time: str = "00:05:00", checkpoint_dir: str | None = None) -> Path:
    """A small srun-launcher spec file (the srun launcher starts one rank per GPU)."""
    cmd = command or ["bash", "-c", "echo rank $RANK of $WORLD_SIZE"]
    lines = [f'name = "{name}"', f'partition = "{partition}"', f"nodes = {nodes}",
             f"gpus_per_node = {gpus}", f'time = "{time}"', extra, "[requeue]",
             "signal_lead_s = 10", "[run]", 'launcher = "srun"',
             "command = [" + ", ".join(_toml_str(c) for c in cmd) + "]"]
    if checkpoint_dir:
        lines += ["[checkpoint]", f'dir = "{checkpoint_dir}"']
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def env_without(binary: str, tmp_path: Path) -> dict[str, str]:
    """os.environ with a PATH on which every SLURM binary but ``binary`` exists (symlinks)."""
    bindir = tmp_path / f"no-{binary}"
    bindir.mkdir(exist_ok=True)
    for name in ("sbatch", "squeue", "sacct", "scancel", "scontrol", "srun", "sinfo"):
        real = Path("/usr/bin") / name
        if name != binary and real.exists() and not (bindir / name).exists():
            (bindir / name).symlink_to(real)
    return {**os.environ, "PATH": str(bindir)}  # not /bin: on Debian it is /usr/bin
