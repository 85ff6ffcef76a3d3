"""The README's demo command, end to end: examples/demo.sh on the devcluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
def test_demo_trains_the_example_to_completion(cluster) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run(["bash", str(ROOT / "examples" / "demo.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = res.stdout
    # the end shows the step the job ended at, not one up to a summary interval older
    assert re.search(r"job \d+ ended COMPLETED after \S+  step (199|200) ", out), out[-2000:]
    assert '"event": "done", "step": 200' in out
    # checkpoints listed and valid: the spec's keep_last = 2 of its interval_steps = 50
    # (CheckpointManager() in the example), the nodes idle again afterwards
    kept = re.findall(r"^\s+(\d+)\s.*\sok$", out, re.M)
    assert kept == ["150", "200"], out[-2000:]
    # the report measures what the steps did (the example says a step's work), honestly
    assert re.search(r"^throughput: \S+ tokens/s over .* \(CPU figures: partition debug's "
                     r"GPUs are emulated", out, re.M), out[-3000:]
    assert re.search(r"^GPU-hours: \S+ allocated, \S+ USD at 2 USD per GPU-hour$", out, re.M)
    assert re.search(r"^plan's estimate for the \S+ tokens kept: ", out, re.M), out[-3000:]
    assert re.search(r"n1\s+IDLE", out) and re.search(r"n2\s+IDLE", out)
