"""Helpers for the submission/status/sweep tests: an isolated record and job folder, a
PATH without one SLURM binary, and a requeue ledger as a job's state directory holds it.

Their spec files: :func:`helpers.specs.write_spec`.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

SHARED = Path("/var/lib/hpctrain/devcluster/shared")
# a test that slows a node on purpose leaves this beside its job logs: the suite's check of
# the slow-node detector's false alarms (tests/cluster/conftest.py) passes over them
SLOW_EXPECTED = "slow-expected"
# A requeue ledger (hpctrain.protocol.ledger): 3 requeues (preemption 2, node_fail 1) and
# the stop at max_preemptions=2, with a damaged line and a requeue without a cause.
LEDGER_LINES = """requeue cause=preemption restart_count=1 by=supervisor
requeue cause=node_fail restart_count=2 by=slurm
garbage line
requeue restart_count=3
requeue cause=preemption restart_count=3 by=supervisor
stop cause=preemption restart_count=3 limit=max_preemptions=2
"""


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


def env_without(binary: str, tmp_path: Path) -> dict[str, str]:
    """os.environ with a PATH on which every SLURM binary but ``binary`` exists (symlinks)."""
    bindir = tmp_path / f"no-{binary}"
    bindir.mkdir(exist_ok=True)
    for name in ("sbatch", "squeue", "sacct", "scancel", "scontrol", "srun", "sinfo"):
        real = Path("/usr/bin") / name
        if name != binary and real.exists() and not (bindir / name).exists():
            (bindir / name).symlink_to(real)
    return {**os.environ, "PATH": str(bindir)}  # not /bin: on Debian it is /usr/bin
