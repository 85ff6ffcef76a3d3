"""No spare left: the job shrinks and trains on in the same Slurm run (issue 57), on the real
devcluster.

The plainest DP loop (tests/programs/plain_dp_loop.py under ``hpctrain.runtime.run``), DP=4
on two nodes of two ranks, ``[elastic] min_nodes = 1`` and no spare (peer copies on by
default with a shrink), a float64 model, one fixed global batch of 16 samples a step (rank r
takes samples r::world in ``ctx.accumulation`` micro-batches), a snapshot every step and a
durable save every 20. The node that is not the batch node is lost for real after step 25
(its slurmd, stepds and processes killed -9). The same Slurm run goes on at world size 2 on
the batch node, each rank taking two micro-batches, restored from the copies in that node's
memory; it completes, and its parameters match an undisturbed run's at DP=4 within 1e-5
(float64: only the order of the gradient sums differs).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpctrain import hostlist
from hpctrain.slurm import client
from helpers import admin
from helpers.cluster import status
from helpers.jobs import isolate
from helpers.lossjobs import empty_queue
from helpers.nodes import lose_node
from helpers.reference import reference
from helpers.slurm import squeue_state, wait_done, wait_until
from helpers.specs import spec_toml
from helpers.torchrun import events

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "plain_dp_loop.py"
TOTAL, EVERY, LOST_AFTER = 50, 20, 25
TOLERANCE = 1e-5


def job_nodes(job: str) -> list[str]:
    out = client.run(["squeue", "-h", "-j", job, "-o", "%N"]).stdout.strip()
    return hostlist.expand(out) if out else []


def test_a_lost_node_without_a_spare_shrinks_the_job_in_the_same_run(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    dev = admin.Cluster()
    empty_queue()
    log = root / "events.jsonl"
    args = ["--steps", str(TOTAL), "--save-every", str(EVERY), "--snapshot-every", "1",
            "--global-batch", "16", "--float64", "--ckpt-dir", str(root / "ckpt"),
            "--events", str(log), "--final", str(root / "final")]
    (root / "spec.toml").write_text(spec_toml(
        name="shrink", partition="wide", nodes=2, gpus_per_node=2, time="00:10:00",
        output=f"{root}/job-%j.out", workdir=str(root), layout={"dp": 4},
        run={"launcher": "srun", "command": [sys.executable, str(PROGRAM), *args,
                                             "--step-sleep", "0.2"],
             "env": {"OMP_NUM_THREADS": "1"}},
        checkpoint={"dir": str(root / "ckpt")}, elastic={"min_nodes": 1},
        requeue={"max_requeues": 1}))
    # undisturbed, at full width, before the job (the recovery's CPU is not shared)
    paths = {str(root / "ckpt"): "{out}/ckpt", str(log): "{out}/ref.jsonl",
             str(root / "final"): "{out}/ref"}
    ref = reference(PROGRAM, 4, [paths.get(a, a) for a in args])
    assert ref.wait(300) == 0, ref.out.read_text()[-3000:]
    res = subprocess.run([sys.executable, "-m", "hpctrain", "submit", "spec.toml", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)["job_id"]
    try:
        wait_until(lambda: max((e["step"] for e in events(log, "step")), default=0)
                   >= LOST_AFTER, 240, f"step {LOST_AFTER}")
        batch, lost = job_nodes(job)
        lose_node(dev, lost, job)
        t_lost = time.time()
        state = wait_done(job, 300)
    finally:
        dev.make_nodes_usable()
        if squeue_state(job):
            client.run(["scancel", job], check=False)
    text = (root / f"job-{job}.out").read_text(errors="replace")
    out = "\n".join(x for x in text.splitlines() if x.startswith(("hpctrain:", "srun:")))
    assert state == "COMPLETED", out
    assert f"shrunk to 1 of 2 node(s): no spare left ([elastic] min_nodes = 1)" in out, out
    assert f"2 rank(s) on {batch} (spare: none)" in out, out
    starts = events(log, "start")
    assert [(s["world"], s["accumulation"]) for s in starts] == [(4, 1), (2, 2)], starts
    # restored from the batch node's own memory: the last step done, not the durable one
    assert f"peer copies: restoring step {starts[1]['step']} from node memory" in out, out
    assert starts[1]["step"] > EVERY, starts
    row = status(job)
    assert row["cause"] == "completed" and row["restarts_in_place"] == {"node_fail": 1}, row
    assert row["requeues"] == {}, row                  # the same Slurm run
    assert sorted({e["step"] for e in events(log, "step")}) == list(range(TOTAL))
    got = torch.load(root / "final" / "rank-0.pt")
    want = torch.load(ref.path / "ref" / "rank-0.pt")
    assert not (root / "final" / "rank-2.pt").exists()      # two ranks finished it
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    first = min(e["time"] for e in events(log, "step") if e["time"] > starts[1]["time"])
    print(f"\nfigures[shrink]: loss -> first step at world size 2 {first - t_lost:.1f} s "
          f"(-> the restarted main's start: {starts[1]['time'] - t_lost:.1f} s); resumed at "
          f"step {starts[1]['step']}; largest parameter difference from the undisturbed "
          f"DP=4 run {diff:.2e} (float64)")
    assert first - t_lost < 30, (first - t_lost, out)
    assert diff <= TOLERANCE, diff
