"""The job supervisor on the real devcluster, as a matrix: script kind x event.

Kinds (tests/programs/): a loop written against hpctrain.runtime (srun launcher, USR1 as its
time-limit signal: the ranks must route it to their stop flag); a plain torchrun DDP script
with its own snapshot file; a plain bash step under srun. Only the first has heard of
hpctrain. Per kind, three jobs (1 node x 2 fake GPUs each), submitted with `hpctrain submit`:

- A: preempted during its start-up (before any runtime exists), then the time-limit warning
  mid-run (``scancel --signal=SIG --batch``, as Slurm delivers --signal=B:SIG), then
  preempted mid-run, then it completes: 3 requeues, every step done, resumed where it saved;
- B: scancel mid-run: CANCELLED, never requeued;
- C: rank 1 fails at step 2: FAILED, not requeued, status names the rank, node and error.

Then the cases around one job: a sweep point preempted (its sibling untouched), stale state
of an earlier job with the same id, the controller stopped for 15 s during a requeue, and
sites that send the job's signal on preemption (SlurmctldParameters=preempt_send_user_signal).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hpctrain import protocol
from hpctrain.slurm import client
from helpers import admin
from helpers.cluster import events, job_log, preempt, send_user_signal, status, submit
from helpers.jobs import isolate
from helpers.slurm import sacct_states, sbatch, wait_done, wait_until
from helpers.specs import spec_toml

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
# 16 steps: run 2 (after 3 + 2 steps) must outlast the urgent job's scheduling; with 10,
# the plain srun counter (0.5 s a step) once completed first under the full suite's load
# (2026-11-28: REQUEUED x2 + COMPLETED, the third preemption came too late)
STEPS, STARTUP_S = 16, 8


@dataclass(frozen=True)
class Kind:
    """One kind of training script and how it is launched."""

    name: str
    launcher: str
    signal: str       # the spec's requeue.signal (the time-limit warning)
    progress: str     # the event name of one finished step in its log
    first: int        # the number its first finished step logs (counter.sh counts from 1)

    def steps_done(self, root: Path) -> list[int]:
        return [e.get("step", e.get("epoch")) for e in events(root, self.progress)]

    def command(self, root: Path, crash_at: int = -1, steps: int = STEPS) -> list[str]:
        log = str(root / "events.jsonl")
        if self.name == "runtime":
            return [sys.executable, str(PROGRAMS / "runtime_steps.py"), "--steps", str(steps),
                    "--save-every", "3", "--ckpt-dir", str(root / "ckpt"), "--events", log,
                    "--startup-sleep", str(STARTUP_S), "--crash-at-step", str(crash_at)]
        if self.name == "torchrun":
            return [sys.executable, str(PROGRAMS / "ddp_snapshot.py"), "--epochs", str(steps),
                    "--save-every", "2", "--snapshot", str(root / "snapshot.pt"),
                    "--events", log, "--startup-sleep", str(STARTUP_S),
                    "--crash-at-epoch", str(crash_at)]
        return ["bash", str(PROGRAMS / "counter.sh"), str(steps), str(root / "state"), log,
                "0.5", str(STARTUP_S), str(crash_at), "1"]


KINDS = {k.name: k for k in (Kind("runtime", "srun", "USR1", "step", 0),
                             Kind("torchrun", "torchrun", "USR2", "epoch", 0),
                             Kind("srun", "srun", "USR2", "step", 1))}


def spec_text(root: Path, name: str, kind: Kind, command: list[str], *,
              checkpoint: bool = True, run: dict[str, Any] | None = None,
              requeue: dict[str, Any] | None = None) -> str:
    """The job's spec (TOML): 1 node x 2 GPUs, the kind's launcher and time-limit signal;
    ``run`` and ``requeue`` add keys to (or replace keys of) those sections."""
    return spec_toml(
        name=name, partition="debug", nodes=1, gpus_per_node=2, time="00:10:00",
        output=f"{root}/job-%j.out", workdir=str(root),
        run={"launcher": kind.launcher, "command": command, "env": {"OMP_NUM_THREADS": "1"},
             **(run or {})},
        requeue={"max_requeues": 5, "signal": kind.signal, "signal_lead_s": 30,
                 **(requeue or {})},
        **({"checkpoint": {"dir": f"{root}/ckpt"}} if checkpoint else {}))












def progress_after_start(root: Path, kind: Kind, starts: int, steps: int) -> bool:
    """Has run number ``starts`` (counting `start` events) done ``steps`` steps?"""
    found = events(root)
    begun = [i for i, e in enumerate(found) if e["event"] == "start"]
    if len(begun) < starts:
        return False
    return sum(e["event"] == kind.progress for e in found[begun[starts - 1]:]) >= steps


@pytest.mark.torch
@pytest.mark.parametrize("kind_name", list(KINDS))
def test_every_kind_of_script_survives_preemption_and_the_time_limit_and_is_not_requeued_after_scancel_or_a_crash(  # noqa: E501
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind_name: str) -> None:
    kind = KINDS[kind_name]
    base = isolate(monkeypatch, tmp_path, shared=True)
    roots = {x: base / x for x in "ABC"}
    for root in roots.values():
        root.mkdir()
    # plain scripts keep no checkpoint dir: their state dir is the submit dir's
    plain = kind.name != "runtime"
    a = submit(roots["A"], spec_text(roots["A"], f"mx-{kind.name}-a", kind,
                                     kind.command(roots["A"]), checkpoint=not plain))
    b = submit(roots["B"], spec_text(roots["B"], f"mx-{kind.name}-b", kind,
                                     kind.command(roots["B"], steps=500), checkpoint=not plain))
    c = submit(roots["C"], spec_text(roots["C"], f"mx-{kind.name}-c", kind,
                                     kind.command(roots["C"], crash_at=2), checkpoint=not plain))
    ra, rb, rc = roots["A"], roots["B"], roots["C"]

    # A, run 0: preempted while it prepares data (no runtime, no snapshot yet)
    wait_until(lambda: len(events(ra, "startup")) >= 1, 240, f"job {a} to start up")
    preempt(a)
    # B (500 steps): cancelled mid-run
    wait_until(lambda: len(events(rb, kind.progress)) >= 2, 300, f"2 steps of job {b}")
    client.run(["scancel", b])
    # A, run 1: the time-limit warning after 3 steps
    wait_until(lambda: progress_after_start(ra, kind, 1, 3), 240, "3 steps of A's run 1")
    client.run(["scancel", f"--signal={kind.signal}", "--batch", a])
    # run 2: preempted mid-run after 2 steps
    wait_until(lambda: progress_after_start(ra, kind, 2, 2), 240, "2 steps of A's run 2")
    preempt(a)

    assert wait_done(a, 300) == "COMPLETED", job_log(ra, a)
    assert wait_done(b, 120) == "CANCELLED", job_log(rb, b)
    assert wait_done(c, 300) == "FAILED", job_log(rc, c)

    # A: three requeues by the supervisor, every step done, resumed where it saved
    assert sacct_states(a) == ["REQUEUED"] * 3 + ["COMPLETED"], job_log(ra, a)
    starts = events(ra, "start")
    assert len(starts) == 3 and events(ra, "done"), job_log(ra, a)
    assert sorted(set(kind.steps_done(ra))) == list(range(kind.first, kind.first + STEPS))
    row = status(a)
    assert row["requeues"] == {"preemption": 2, "time_limit": 1}, row
    assert row["cause"] == "completed" and row["requeue_limit"] is None, row
    text = job_log(ra, a)
    assert text.count("requeueing job") == 3 and "after a time_limit" in text
    assert "restart 3, after a preemption" in text
    if kind.name == "runtime":
        stops = events(ra, "stop")
        # the warning was USR1: the ranks saved on it (0 steps lost) and knew why
        assert [s["cause"] for s in stops] == ["time_limit", "preemption"], text
        assert [s["step"] for s in starts] == [0, stops[0]["step"], stops[1]["step"]]
        assert [s["last"] for s in starts] == ["preemption", "time_limit", "preemption"]
    elif kind.name == "torchrun":
        assert [s["restart"] for s in starts] == ["1", "2", "3"]   # SLURM_RESTART_COUNT

    # B: cancelled, never requeued, and status says so
    assert sacct_states(b) == ["CANCELLED"], job_log(rb, b)
    assert f"job {b} ends: cancelled" in job_log(rb, b)
    assert status(b)["cause"] == "cancelled"

    # C: the crash is not requeued; status names the failing rank, its node and the error
    assert sacct_states(c) == ["FAILED"], job_log(rc, c)
    row = status(c)
    verdict = row["verdict"]
    assert row["cause"] == "user_crash" and row["requeues"] == {}, row
    assert verdict["rank"] == "1" and verdict["node"] in ("n1", "n2"), verdict
    expected = {"runtime": "RuntimeError: simulated crash at step 2",
                "torchrun": "RuntimeError: bad batch in epoch 2", "srun": ""}[kind.name]
    assert verdict["error"] == expected, verdict
    if kind.name == "srun":
        assert verdict["failure"] == f"rank 1 on {verdict['node']} (exited with exit code 3)"


# ---- single jobs -------------------------------------------------------------------------------
def counter_spec(root: Path, name: str, *, steps: int = 6) -> str:
    """A plain srun bash step (2 ranks) that counts in the checkpoint dir."""
    cmd = ["bash", "-c", f'exec bash {PROGRAMS / "counter.sh"} {steps} '
           '"$HPCTRAIN_CKPT_DIR/state" "$HPCTRAIN_CKPT_DIR/events.jsonl" 0.5', "counter"]
    return spec_text(root, name, KINDS["srun"], cmd)


def test_a_preempted_sweep_point_is_requeued_alone(cluster, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two points, one per node. Preempting the node of task 0 (whose own job id is the
    array's) requeues task 0 only: the supervisor addresses it as <array>_0."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    (root / "job.toml").write_text(counter_spec(root, "sweep-pt", steps=12))
    res = subprocess.run([sys.executable, "-m", "hpctrain", "sweep", str(root / "job.toml"),
                          "--grid", "run.env.POINT=a,b", "--json"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    array = json.loads(res.stdout)["sweep_id"]
    t0, t1 = f"{array}_0", f"{array}_1"
    p0, p1 = root / "ckpt" / "point-000", root / "ckpt" / "point-001"
    wait_until(lambda: len(events(p0, "step")) >= 2 and len(events(p1, "step")) >= 1, 180,
               "both points to run")
    preempt(t0)
    assert wait_done(t0, 240) == "COMPLETED"
    assert wait_done(t1, 240) == "COMPLETED"
    assert sacct_states(t0) == ["REQUEUED", "COMPLETED"]
    assert sacct_states(t1) == ["COMPLETED"]                  # untouched
    assert len(events(p1, "start")) == 1 and len(events(p0, "start")) == 2
    ledger = protocol.state_dir(p0, t0) / protocol.LEDGER
    assert ledger.read_text() == "requeue cause=preemption restart_count=1 by=supervisor\n"
    assert not (protocol.state_dir(p1, t1) / protocol.LEDGER).exists()


def test_state_left_by_an_earlier_job_with_the_same_id_is_moved_aside(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job is queued on hold, then the state of an 'earlier job with its id' (another
    cluster, or before Slurm's ids reset) is planted where it will look: a ledger past
    max_requeues, a requeue record and a stop notice. It must run as the fresh job it is."""
    from hpctrain.render.script import render_script
    from hpctrain.spec.model import JobSpec

    root = isolate(monkeypatch, tmp_path, shared=True)
    (root / "job.toml").write_text(counter_spec(root, "stale-state", steps=3))
    script = render_script(JobSpec.load(root / "job.toml"), python=sys.executable)
    (root / "job.sbatch").write_text(script)
    job = sbatch("--hold", str(root / "job.sbatch"))   # plain sbatch: no submission id either
    stale = protocol.state_dir(root / "ckpt", job)
    stale.mkdir(parents=True)
    (stale / "identity").write_text("run_id=old\ncluster=elsewhere\njob=" + job + "\n")
    (stale / "ledger").write_text("requeue cause=preemption restart_count=1 by=supervisor\n" * 9)
    protocol.write_record(stale / "exit", {"cause": "time_limit", "requeue": 1,
                                           "restart_count": 0, "run_id": "old"})
    protocol.write_record(stale / "stop", {"cause": "preemption", "restart_count": 0})
    client.run(["scontrol", "release", job])
    assert wait_done(job, 120) == "COMPLETED", job_log(root, job)
    text = job_log(root, job)
    assert f"moved {stale} aside" in text and "a fresh job (restart 0)" in text
    assert sacct_states(job) == ["COMPLETED"] and len(events(root / "ckpt", "done")) == 1
    assert protocol.read_record(stale / "identity")["run_id"] != "old"
    assert protocol.read_record(stale / "outcome")["cause"] == "completed"
    aside = list(stale.parent.glob(f"{job}.stale-*"))
    assert len(aside) == 1 and (aside[0] / "ledger").read_text().count("\n") == 9


def test_a_requeue_survives_the_controller_being_down_for_15_s(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The time-limit warning comes while a setup line runs (the batch shell notes it);
    the controller is down for 15 s when the supervisor takes over and requeues: it keeps
    trying until Slurm answers. (A warning mid-step meets no outage: srun itself waits for
    the controller before it reports the step's end.) The setup line waits for the test's
    go-ahead, so the warning lands during setup and the hand-over during the outage
    however loaded the machine is."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    wait_go = f"until [ -e {root}/go ]; do sleep 0.2; done"
    setup = ["echo setting up", f"[ ${{SLURM_RESTART_COUNT:-0}} = 0 ] && {wait_go} || true"]
    job = submit(root, spec_text(root, "ctld-down", KINDS["srun"],
                                 ["bash", "-c", "echo run ${HPCTRAIN_RESTART_COUNT}"],
                                 run={"setup": setup}))
    dev = admin.Cluster()
    wait_until(lambda: "setting up" in job_log(root, job), 120, f"job {job} to run its setup")
    client.run(["scancel", "--signal=USR2", "--batch", job])
    time.sleep(2)  # delivered; the batch shell notes it between two of the setup's sleeps
    try:
        assert dev.stop_daemon("slurmctld")
        (root / "go").touch()  # setup ends, the supervisor takes over with no controller
        time.sleep(15)
    finally:
        dev.start_daemon("slurmctld")
    assert wait_done(job, 180) == "COMPLETED", job_log(root, job)
    text = job_log(root, job)
    assert "the controller does not answer" in text, text
    assert "requeueing job" in text and "run 1" in text and "run 0" not in text
    assert sacct_states(job) == ["REQUEUED", "COMPLETED"]


@pytest.mark.torch
def test_sites_that_send_the_jobs_signal_on_preemption(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SlurmctldParameters=preempt_send_user_signal: GraceTime starts with the job's
    --signal (B:USR2, to the batch step only; the steps get nothing). The supervisor asks
    Slurm, finds PreemptTime, tells the ranks it is a preemption and passes the stop on."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    kind = KINDS["runtime"]
    cmd = kind.command(root)
    cmd[cmd.index("--startup-sleep") + 1] = "0"
    with send_user_signal(Path(cluster.client_env()["SLURM_CONF"])):
        job = submit(root, spec_text(root, "send-user-signal", kind, cmd,
                                     requeue={"signal": "USR2"}))
        wait_until(lambda: len(events(root, "step")) >= 2, 180, f"2 steps of job {job}")
        preempt(job)
        assert wait_done(job, 240) == "COMPLETED", job_log(root, job)
    text = job_log(root, job)
    assert "caught SIGUSR2 (preemption); asking the training step to stop" in text, text
    stop, starts = events(root, "stop"), events(root, "start")
    assert [s["cause"] for s in stop] == ["preemption"] and starts[1]["step"] == stop[0]["step"]
    assert sacct_states(job) == ["REQUEUED", "COMPLETED"]
