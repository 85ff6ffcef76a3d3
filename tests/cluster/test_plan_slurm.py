"""Specs written by `hpctrain plan` are accepted by the real devcluster (sbatch --test-only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.render.script import render_script
from hpctrain.slurm import client
from hpctrain.spec.model import JobSpec


@pytest.mark.slurm
@pytest.mark.parametrize("args", [
    ["--params", "13B"],                        # 2 nodes x 2 GPUs, ZeRO-3, deepspeed
    ["--params", "70B", "--mode", "lora"],      # 1 node, tp=2
    ["--params", "70B", "--mode", "qlora"],     # 1 node, 1 GPU
    ["--params", "7B", "--partition", "urgent", "--nodes", "2"],
])
def test_planned_spec_passes_sbatch_test_only(cluster, tmp_path: Path, args: list[str]) -> None:
    spec_path = tmp_path / "plan.toml"
    partition = [] if "--partition" in args else ["--partition", "debug"]
    assert main(["plan", *args, *partition, "--write-spec", str(spec_path)]) == 0
    script = render_script(JobSpec.load(spec_path))
    res = client.run(["sbatch", "--test-only"], input=script, check=False)
    assert res.returncode == 0, res.stderr
    assert "to start at" in res.stderr
