"""A lost node is recognised however it dies (issue 42, item 0), on the real devcluster.

Real losses come in several orders (tests/helpers/nodes.py ``ORDERS``). When a GPU falls
off the bus the job's processes die first and their slurmstepd reports it ("task 1:
Killed": srun ends the step at once), then the node goes dark; a power loss takes
everything at once. Either way the survivors' only evidence is a lost peer ("Connection
closed by peer"). Until 2026-11-27 the supervisor judged by that first failure and ended
the job FAILED (user_crash): no spare, no requeue. Now a failure whose only evidence is
lost peers and ranks that died without a word waits for the node's own answer (a step
launched there through its slurmd) before it is called a crash.

One job per launcher (srun, torchrun, deepspeed; the plainest DP loop a user writes, with
``hpctrain.runtime.init()``: restarts in new processes, tests/programs/plain_dp_loop.py
``--init``; under ``runtime.run`` the survivors wait for the word and keep beating, so the
lost node's silence shows as before), DP=4 on partition ``wide``
(n1-n3) with ``[elastic] spare_nodes = 1``, through two losses: n2 dies processes first
(its spare n3 takes its place in the same allocation), then n3 dies all at once (no spare
is left: the job is requeued, as without spares). Each ends COMPLETED, every step done,
bitwise equal to an undisturbed run. A plain srun script that never imports hpctrain
(tests/programs/counter.sh: no progress records, only srun's word) loses n2 processes
first and restarts on the spare as well. The order in which the node goes silent first is
tests/cluster/test_elastic_cluster.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpctrain.slurm import client
from helpers import admin
from helpers.cluster import status
from helpers.jobs import isolate
from helpers.nodes import bring_back, lose_node
from helpers.slurm import sacct_states, squeue_state, wait_done, wait_until
from helpers.specs import spec_toml
from helpers.torchrun import bitwise_equal, env_for, events, start

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
TOTAL, EVERY = 40, 8


def job_log(root: Path, job: str) -> str:
    """The supervisor's lines of the job's log (the ranks' tracebacks left out: under
    torchrun they fill it)."""
    path = root / f"job-{job}.out"
    text = path.read_text(errors="replace") if path.exists() else "(no job output)"
    return "\n".join(line for line in text.splitlines()
                     if line.startswith(("hpctrain:", "srun:", "(no job")))


def empty_queue() -> None:
    """Killing a node under somebody else's job would break their test."""
    wait_until(lambda: not client.run(["squeue", "-h", "-o", "%i"]).stdout.strip(), 300,
               "an empty queue (other tests' jobs to finish)", interval_s=2)


def loop_spec(root: Path, launcher: str) -> str:
    cmd = [sys.executable, str(PROGRAMS / "plain_dp_loop.py"), "--steps", str(TOTAL),
           "--save-every", str(EVERY), "--step-sleep", "0.2", "--ckpt-dir",
           str(root / "ckpt"), "--events", str(root / "events.jsonl"), "--final",
           str(root / "final"), "--init"]
    return spec_toml(
        name=f"loss-{launcher}", partition="wide", nodes=2, gpus_per_node=2,
        time="00:10:00", output=f"{root}/job-%j.out", workdir=str(root), layout={"dp": 4},
        run={"launcher": launcher, "command": cmd, "env": {"OMP_NUM_THREADS": "1"}},
        checkpoint={"dir": str(root / "ckpt")}, elastic={"spare_nodes": 1},
        requeue={"max_requeues": 3, "max_crash_restarts": 0})


def submit(root: Path, spec: str) -> str:
    path = root / "spec.toml"
    path.write_text(spec)
    res = subprocess.run([sys.executable, "-m", "hpctrain", "submit", str(path), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["job_id"]


def step_done(root: Path, at_least: int) -> bool:
    return max((e["step"] for e in events(root / "events.jsonl", "step")), default=-1) \
        >= at_least


def final_state(prefix: Path) -> list[dict]:
    return [torch.load(prefix / f"rank-{r}.pt") for r in range(4)]


def reference(tmp: Path) -> subprocess.Popen:
    """The same loop, undisturbed, under a local torchrun (4 ranks)."""
    args = ["--steps", str(TOTAL), "--save-every", str(EVERY), "--step-sleep", "0",
            "--ckpt-dir", str(tmp / "ref-ckpt"), "--events", str(tmp / "ref.jsonl"),
            "--final", str(tmp / "ref")]
    (tmp / "ref-ckpt").mkdir()
    return start(PROGRAMS / "plain_dp_loop.py", 4, args, env_for(), tmp / "ref.out")


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "deepspeed"])
def test_a_node_lost_processes_first_then_one_lost_all_at_once(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    dev = admin.Cluster()
    empty_queue()
    job = submit(root, loop_spec(root, launcher))
    ref = None
    try:
        wait_until(lambda: step_done(root, EVERY + 2), 240, f"step {EVERY + 2}")
        lose_node(dev, "n2", job, order="processes-first")
        t_lost = time.time()
        ref = reference(tmp_path)
        wait_until(lambda: step_done(root, 3 * EVERY + 2) and len(
            events(root / "events.jsonl", "start")) >= 2, 180,
            f"the restart on the spare and step {3 * EVERY + 2}")
        lose_node(dev, "n3", job, order="all-at-once")
        wait_until(lambda: squeue_state(job) == "PENDING", 120, "the job requeued")
        bring_back(dev, job)
        state = wait_done(job, 240)
    finally:
        dev.make_nodes_usable()
        if squeue_state(job):
            client.run(["scancel", job], check=False)
        if ref is not None:
            try:
                ref.wait(timeout=300)
            except subprocess.TimeoutExpired:
                ref.kill()
    out = job_log(root, job)
    assert state == "COMPLETED", out
    # n2: srun ended the step at once (its stepd saw the deaths) and n2 answered no step;
    # or, when the survivors were slower to leave than n2's ranks were to go silent, the
    # silence found it first: a lost node either way, never a crash
    asked, silent = "node n2 did not answer" in out, "lost node(s) n2" in out
    assert (asked or silent) and "on n1,n3 (spare: none)" in out, out
    assert "user_crash" not in out, out
    row = status(job)
    assert row["cause"] == "completed", row
    assert row["restarts_in_place"] == {"node_fail": 1}, row
    assert row["requeues"] == {"node_fail": 1}, row
    starts = events(root / "events.jsonl", "start")
    assert [s["restart"] for s in starts][-1] == 1, starts
    done = [e["step"] for e in events(root / "events.jsonl", "step")]
    assert sorted(set(done)) == list(range(TOTAL)), done
    first = min(e["time"] for e in events(root / "events.jsonl", "step")
                if e["time"] > starts[1]["time"])
    print(f"\nfigures[loss-{launcher}]: processes-first loss -> first step on the spare "
          f"{first - t_lost:.1f} s (found by {'asking n2' if asked else 'its silence'}); "
          f"sacct {sacct_states(job)}")
    assert ref is not None and ref.returncode == 0, (tmp_path / "ref.out").read_text()[-3000:]
    assert bitwise_equal(final_state(tmp_path / "ref"), final_state(root / "final"))


def test_a_plain_script_that_loses_a_node_processes_first_moves_to_the_spare(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """counter.sh never imports hpctrain: no progress record, no last word. srun says
    "task 2: Killed" on n2 and ends the step; n2 answers no step: a lost node."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    dev = admin.Cluster()
    empty_queue()
    log, counts = root / "counter.jsonl", root / "counts"
    total = 30
    spec = spec_toml(
        name="loss-plain", partition="wide", nodes=2, gpus_per_node=2, time="00:10:00",
        output=f"{root}/job-%j.out", workdir=str(root),
        run={"launcher": "srun", "command": ["bash", str(PROGRAMS / "counter.sh"),
                                             str(total), str(counts), str(log), "0.3"]},
        elastic={"spare_nodes": 1}, requeue={"max_requeues": 2, "max_crash_restarts": 0})
    job = submit(root, spec)

    def counted() -> list[int]:
        return [e["step"] for e in events(log, "step")]
    try:
        wait_until(lambda: max(counted(), default=0) >= 5, 180, "5 counted steps")
        lose_node(dev, "n2", job, order="processes-first")
        state = wait_done(job, 240)
    finally:
        dev.make_nodes_usable()
        if squeue_state(job):
            client.run(["scancel", job], check=False)
    out = job_log(root, job)
    assert state == "COMPLETED", out
    assert "node n2 did not answer" in out and "on n1,n3 (spare: none)" in out, out
    row = status(job)
    assert row["restarts_in_place"] == {"node_fail": 1} and row["requeues"] == {}, row
    assert max(counted()) == total and len(events(log, "done")) == 1, out


def test_the_batch_node_lost_all_at_once_is_requeued_by_slurm_and_resumes(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """n1 hosts the batch step: a power loss takes the supervisor along, so Slurm ends the
    run NODE_FAIL and requeues it (never worse off than plain Slurm); the next run's
    supervisor enters that requeue from accounting, and the job resumes from its
    checkpoint and completes, every step done. (Killed processes first, the batch step's
    stepd would report the batch script's death and Slurm would end the job FAILED itself,
    before the node goes dark: as plain Slurm does. Ranks dying first while the supervisor
    lives is the fake-scheduler cell test_the_batch_node_lost_processes_first_is_requeued.)"""
    root = isolate(monkeypatch, tmp_path, shared=True)
    dev = admin.Cluster()
    empty_queue()
    job = submit(root, loop_spec(root, "srun"))
    try:
        wait_until(lambda: step_done(root, EVERY + 2), 240, f"step {EVERY + 2}")
        lose_node(dev, "n1", job, order="all-at-once")
        wait_until(lambda: squeue_state(job) == "PENDING", 120, "Slurm's requeue")
        bring_back(dev, job)
        state = wait_done(job, 240)
    finally:
        dev.make_nodes_usable()
        if squeue_state(job):
            client.run(["scancel", job], check=False)
    out = job_log(root, job)
    assert state == "COMPLETED", out
    row = status(job)
    assert row["cause"] == "completed" and row["requeues"] == {"node_fail": 1}, row
    starts = events(root / "events.jsonl", "start")
    assert starts[-1]["restart"] == 1 and starts[-1]["step"] >= EVERY, starts
    done = [e["step"] for e in events(root / "events.jsonl", "step")]
    assert sorted(set(done)) == list(range(TOTAL)), done
