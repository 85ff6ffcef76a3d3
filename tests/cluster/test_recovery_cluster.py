"""Every layout survives every interruption, on the real devcluster (2 nodes x 2 fake GPUs).

One job per layout (DP=4, TP=2 x DP=2, PP=2 x DP=2 with examples/train_gpt.py, and
DeepSpeed ZeRO-2 over DP=4 with examples/train_deepspeed.py), submitted with
`hpctrain submit` and the built-in templates, goes through all three causes that requeue:

1. preemption by an `urgent` job: it saves on the signal, Slurm and the batch script
   requeue it, it resumes at the saved step (0 steps lost);
2. the time-limit warning, as Slurm delivers it (USR2 to the batch shell, via
   `scancel --signal=USR2 --batch` instead of waiting for a real limit; a real one is in
   tests/cluster/test_render_slurm.py): same;
3. node loss (n2's slurmd and every process it started, kill -9): NODE_FAIL, Slurm
   requeues it, it resumes from the last periodic checkpoint and runs those steps again.

Then it finishes: every step is in the loss log (only the node-loss steps twice, with the
same losses), the final model equals an uninterrupted local run with the same seed and
layout bit for bit, and `hpctrain status` counts one requeue per cause. A user crash in
each layout ends FAILED, is not requeued, and status names it. Prints the figures.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

import pytest

from hpctrain.slurm import client
from hpctrain.jobs.poll import last_checkpoint_step
from helpers.cluster import status
from helpers.examples import example_spec, submit_example
from helpers import admin
from helpers.jobs import isolate
from helpers.nodes import LOST_NODE, bring_back, lose_node, node_state, report_down
from helpers.slurm import sacct_states, sbatch, squeue_state, wait_done, wait_until
from helpers.torchrun import EXAMPLES, bitwise_equal, env_for, events, final_state, records, \
    steps
from helpers.warm import WarmRun

TOTAL, EVERY = 40, 10


@dataclass(frozen=True)
class Case:
    script: str
    layout: dict[str, int]
    env: dict[str, str] = field(default_factory=dict)
    launcher: str = "torchrun"   # both launchers, both frameworks
    # wait for Slurm to notice the lost node by itself (SlurmdTimeout, ~25 s) and report
    # that figure; the other layouts report the node DOWN at once, as a health check would
    natural_detection: bool = False

    def local_env(self) -> dict[str, str]:
        return env_for(tp=self.layout.get("tp", 1), pp=self.layout.get("pp", 1), **self.env)


CASES = {
    "dp4": Case("train_gpt.py", {"dp": 4}, launcher="srun"),
    "tp2xdp2": Case("train_gpt.py", {"tp": 2}, natural_detection=True),
    "pp2xdp2": Case("train_gpt.py", {"pp": 2}, launcher="srun"),
    "zero2": Case("train_deepspeed.py", {"dp": 4}, {"DS_ACCELERATOR": "cpu"}, launcher="srun"),
}


def cases() -> list:
    """CASES as parameters; ZeRO-2 needs deepspeed (conftest: fail in CI if missing)."""
    return [pytest.param(n, marks=[pytest.mark.deepspeed] if "deepspeed" in c.script else [])
            for n, c in CASES.items()]


def submit_case(root: Path, case: Case, **spec: object) -> str:
    """Submit the case's example script with `hpctrain submit`; the job id."""
    return submit_example(root, example_spec(root, script=case.script, layout=case.layout,
                                             env=case.env, launcher=case.launcher, **spec))


def job_out(root: Path, job: str) -> str:
    path = root / f"job-{job}.out"
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no job output)"


def run_starts(job_id: str) -> list[float]:
    """Slurm's start time of every run of the job, oldest first."""
    out = client.run(["sacct", "-n", "-X", "-P", "-D", "-j", job_id, "-o", "Start"]).stdout
    return [datetime.fromisoformat(s.strip()).timestamp() for s in out.splitlines()
            if s.strip() and s.strip() != "Unknown"]


def runs_started(log: Path, n: int) -> bool:
    return len(events(log, "start")) >= n


def steps_lost(log_records: list[dict], stop: dict) -> int:
    """Completed steps a stop lost: the last step finished before it, minus the step it
    saved (the next run starts there), plus one. 0 when the save was up to date."""
    before = log_records[:log_records.index(stop)]
    return max(r["step"] for r in before if "loss" in r) + 1 - stop["step"]


def reference_run(case: Case, tmp: Path) -> WarmRun:
    """The same training, uninterrupted, on 4 local ranks (same layout)."""
    args = ["--steps", str(TOTAL), "--save-every", str(EVERY), "--seed", "11",
            "--ckpt-dir", str(tmp / "ref-ckpt"), "--log-file", str(tmp / "ref.jsonl"),
            "--final-state", str(tmp / "ref")]
    return WarmRun(EXAMPLES / case.script, 4, args, case.local_env(), tmp / "ref.out")


def wait_quiet_cluster() -> None:
    # killing n2 under somebody else's job would break their test
    wait_until(lambda: not client.run(["squeue", "-h", "-o", "%i"]).stdout.strip(), 300,
               "an empty queue (other tests' jobs to finish)", interval_s=2)


def lose_a_node(dev: admin.Cluster, case: Case, job: str, log: Path,
                meanwhile: Callable[[], object]) -> dict:
    """Kill n2 under the job; once Slurm has requeued it, bring n2 back. ``meanwhile``
    starts the reference run: the CPU is idle while Slurm deals with the lost node."""
    killed = lose_node(dev, LOST_NODE, job)
    t_lost = time.time()
    meanwhile()
    if not case.natural_detection:
        report_down(LOST_NODE)
    wait_until(lambda: "NODE_FAIL" in sacct_states(job), 90, "Slurm to see NODE_FAIL")
    to_requeue = time.time() - t_lost
    # Bring the node back only once Slurm has settled the lost run, and with the job held
    # until the node is usable again (helpers.nodes.bring_back says why).
    wait_until(lambda: squeue_state(job) == "PENDING", 60, f"job {job} back in the queue")
    wait_until(lambda: "completing" not in node_state("n1"), 30, "n1 done completing")
    bring_back(dev, job)
    return {"killed": killed, "t_lost": t_lost, "to_requeue": to_requeue,
            "last_step": max(steps(log))}


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("name", cases())
def test_preemption_time_limit_and_node_loss_resume_bitwise(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    case = CASES[name]
    root = isolate(monkeypatch, tmp_path, shared=True)
    log, ckpt, dev = root / "loss.jsonl", root / "ckpt", admin.Cluster()
    wait_quiet_cluster()
    job = submit_case(root, case, name=f"rt-{name}", total=TOTAL, save_every=EVERY,
                      step_sleep=0.25, extra=("--final-state", str(root / "final")))
    refs: list[WarmRun] = []   # the uninterrupted reference run
    try:
        # 1. preemption
        wait_until(lambda: len(steps(log)) >= 5, 240, "5 training steps on the cluster")
        urgent = sbatch("-p", "urgent", "--nodes=2", "--gres=gpu:2",
                        f"--output={root}/urgent-%j.out", "--wrap", "sleep 2")
        assert wait_done(urgent, 180) == "COMPLETED"
        # 2. the time-limit warning, a few steps into the second run
        wait_until(lambda: runs_started(log, 2) and
                   len(steps(log)) >= events(log, "start")[1]["step"] + 4, 180,
                   "4 steps of the second run")
        client.run(["scancel", "--signal=USR2", "--batch", job])
        # 3. node loss, after the next periodic checkpoint of the third run (+2 steps)
        wait_until(lambda: runs_started(log, 3), 180, "the third run")
        resumed = events(log, "start")[2]["step"]
        periodic = (resumed // EVERY + 1) * EVERY
        wait_until(lambda: (last_checkpoint_step(str(ckpt)) or 0) >= periodic
                   and max(steps(log)) >= periodic + 1, 120,
                   f"the periodic checkpoint at step {periodic} and 2 more steps")
        saved = last_checkpoint_step(str(ckpt))
        loss = lose_a_node(dev, case, job, log,
                           lambda: refs.append(reference_run(case, tmp_path)))
        state = wait_done(job, 240)
    finally:
        dev.make_nodes_usable()  # slurmd started, node resumed
        if squeue_state(job):
            client.run(["scancel", job], check=False)
        for ref in refs:
            try:
                ref.wait(timeout=300)
            except subprocess.TimeoutExpired:
                ref.kill()
    assert state == "COMPLETED", job_out(root, job)
    assert sacct_states(job) == ["REQUEUED", "REQUEUED", "NODE_FAIL", "COMPLETED"], \
        job_out(root, job)

    stops, starts = events(log, "stop"), events(log, "start")
    assert [s["cause"] for s in stops] == ["preemption", "time_limit"], job_out(root, job)
    # each run resumes where the last one saved: the signal's step, then the periodic one
    assert [s["step"] for s in starts] == [0, stops[0]["step"], stops[1]["step"], saved]
    assert [s["last_exit_cause"] for s in starts[1:]] == ["preemption", "time_limit",
                                                          "node_fail"]
    done = steps(log)
    assert sorted(set(done)) == list(range(TOTAL))
    rerun = sorted(s for s in set(done) if done.count(s) > 1)
    assert rerun == list(range(saved, loss["last_step"] + 1))   # only after the node loss
    losses: dict[int, set[float]] = {}
    for r in records(log):
        if "loss" in r:
            losses.setdefault(r["step"], set()).add(r["loss"])
    assert all(len(v) == 1 for v in losses.values()), "a re-run step got another loss"

    assert refs[0].returncode == 0, (tmp_path / "ref.out").read_text()[-3000:]
    assert bitwise_equal(final_state(tmp_path / "ref", 4), final_state(root / "final", 4))

    row = status(job)
    assert row["requeues"] == {"preemption": 1, "time_limit": 1, "node_fail": 1}, row
    assert row["requeue_limit"] is None and row["cause"] == "completed", row

    # figures: steps lost per signal; requeued run start -> its first training step
    lost = [steps_lost(records(log), st) for st in stops]
    t_runs = run_starts(job)
    first_steps = [next(r["time"] for r in records(log) if "loss" in r and r["time"] > t)
                   for t in t_runs[1:]]
    to_first = ", ".join(f"{f - t:.1f}" for f, t in zip(first_steps, t_runs[1:]))
    how = "SlurmdTimeout" if case.natural_detection else "node reported down"
    print(f"\nfigures[{name}]: steps lost per preemption / time-limit = {lost[0]} / {lost[1]}; "
          f"steps re-run after node loss = {len(rerun)}; seconds from node loss to NODE_FAIL "
          f"= {loss['to_requeue']:.1f} ({how}); seconds from requeued start to first step "
          f"(preempt, time limit, node loss) = {to_first}")
    assert lost == [0, 0]


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("name", cases())
def test_user_crash_fails_without_requeue_and_status_names_it(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    case = CASES[name]
    root = isolate(monkeypatch, tmp_path, shared=True)
    job = submit_case(root, case, name=f"rt-crash-{name}", total=30, save_every=5,
                      step_sleep=0.0, time="00:10:00", extra=("--crash-at-step", "7"))
    state = wait_done(job, 180)
    assert state == "FAILED", job_out(root, job)
    assert sacct_states(job) == ["FAILED"]  # no REQUEUED: a crash is not retried
    assert steps(root / "loss.jsonl") == list(range(7))
    row = status(job)
    assert row["state"] == "FAILED" and row["requeues"] == {}, row
    assert row["cause"] == "user_crash", row
    verdict = row["verdict"]
    assert verdict["step"] == "7" and verdict["rank"].isdigit(), verdict
    assert "simulated user crash" in verdict["error"] and verdict["node"] in ("n1", "n2")
    table = subprocess.run([sys.executable, "-m", "hpctrain", "status", job],
                           capture_output=True, text=True, timeout=60).stdout
    assert "user_crash@7 RuntimeError" in table
