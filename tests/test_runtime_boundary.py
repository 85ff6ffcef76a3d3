"""In-job code stays in-job: importing hpctrain.runtime (and the checkpoint manager) in a
fresh interpreter must not load any submission-side module, even transitively, and
hpctrain.runtime must not import torch until init() is called.

tests/test_architecture.py checks the direct imports of each module by parsing them;
this checks what actually gets loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SUBMISSION = ("hpctrain.slurm", "hpctrain.submission", "hpctrain.render", "hpctrain.spec",
              "hpctrain.devcluster", "hpctrain.commands", "hpctrain.cli", "submitit")


def loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    return set(json.loads(out.stdout.splitlines()[-1]))


def offenders(mods: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if any(m == b or m.startswith(b + ".") for b in banned))


def test_runtime_loads_no_submission_code_and_no_torch() -> None:
    mods = loaded_after("import hpctrain.runtime\nfrom hpctrain.runtime import init, CAUSES")
    assert offenders(mods, SUBMISSION) == []
    assert "torch" not in mods  # the batch script may ask it for exit codes cheaply


@pytest.mark.torch
def test_runtime_and_checkpoint_in_use_load_no_submission_code() -> None:
    mods = loaded_after(
        "import hpctrain.runtime.context, hpctrain.checkpoint\n"
        "from hpctrain.checkpoint import CheckpointManager\n"
        "import torch.distributed.device_mesh")
    assert "hpctrain.checkpoint.manager" in mods  # the probe did load it
    assert offenders(mods, SUBMISSION) == []


def test_checkpoint_loads_no_slurm_code() -> None:
    mods = loaded_after("import hpctrain.checkpoint, hpctrain.checkpoint.manifest")
    assert offenders(mods, ("hpctrain.slurm", "submitit")) == []
