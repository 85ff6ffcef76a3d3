"""In-process restarts under every launcher (issue 41), on the real devcluster with the real
supervisor, for the plainest data-parallel loop a user writes (tests/programs/
plain_dp_loop.py: ``all_reduce`` of each gradient on the default group, a checkpoint
manager built inside ``main``), DP=4 over 2 nodes x 2 fake GPUs.

One job per launcher (srun, torchrun, deepspeed), each through four faults, one per
attempt of its first run (the cells of the launcher x fault matrix share the job):

- attempt 0: rank 2 raises just after the step-20 save (the case of issue 41: under srun
  it ended COMPLETED at step 20 of 40, under torchrun FAILED with no restart);
- attempt 1: rank 1 hangs in Python before step 23; the others wait for it in the
  all-reduce; the watchdog finds the hang (hang_timeout_s = 10) and every rank is asked
  to leave the attempt;
- attempt 2: the save of step 30 fails on every rank (rank 0's state cannot be pickled);
- attempt 3: rank 3 waits in a receive nobody sends before step 33 (stuck in C++, and so
  are the others, in the all-reduce): every rank gives up at its collective timeout
  (collective_timeout_s = 5), a hang.

Each restarts in the same processes (one Slurm run, the same pid for rank 0, the ledger
says ``mode=inprocess``), from the newest durable save, and the job ends COMPLETED
bitwise equal to an undisturbed run of the same script. A job whose crash may not be
restarted (``max_crash_restarts = 0``) ends FAILED with that reason, never COMPLETED.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.examples import submit_example
from helpers.jobs import isolate
from helpers.slurm import sacct_states, wait_done
from helpers.specs import spec_toml
from helpers.torchrun import env_for, events
from helpers.warm import WarmRun

from hpctrain import protocol

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "plain_dp_loop.py"
TOTAL, EVERY = 40, 5
FAULTS = ("crash@20:2:0", "hang@23:1:1", "save-crash@30:0:2", "collective-hang@33:3:3")


def plain_spec(root: Path, launcher: str, faults: tuple[str, ...], step_restarts: int = 6,
               **requeue: int | None) -> str:
    cmd = [sys.executable, str(PROGRAM), "--steps", str(TOTAL), "--save-every", str(EVERY),
           "--step-sleep", "0.05", "--ckpt-dir", str(root / "ckpt"), "--events",
           str(root / "events.jsonl"), "--final", str(root / "final"),
           *(w for f in faults for w in ("--fault", f))]
    return spec_toml(
        name=f"plain-{launcher}", partition="debug", nodes=2, gpus_per_node=2,
        time="00:10:00", output=f"{root}/job-%j.out", workdir=str(root), layout={"dp": 4},
        run={"launcher": launcher, "command": cmd, "env": {"OMP_NUM_THREADS": "1"}},
        checkpoint={"dir": str(root / "ckpt")},
        # a limit given as None is left out of the spec: its default applies
        requeue={k: v for k, v in {"max_requeues": 2, "max_crash_restarts": 3, "max_hangs": 3,
                                   **requeue}.items() if v is not None},
        watchdog={"hang_timeout_s": 10, "collective_timeout_s": 5,
                  "max_step_restarts": step_restarts})


def final(directory: Path) -> list[dict[str, torch.Tensor]]:
    return [torch.load(directory / f"rank-{r}.pt") for r in range(4)]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, torch.Tensor]]:
    """The same script without faults, on 4 local ranks: the parameters to match."""
    tmp = tmp_path_factory.mktemp("undisturbed")
    (tmp / "ckpt").mkdir()
    proc = WarmRun(PROGRAM, 4, ["--steps", str(TOTAL), "--save-every", str(EVERY),
                              "--step-sleep", "0", "--ckpt-dir", str(tmp / "ckpt"),
                              "--events", str(tmp / "events.jsonl"), "--final",
                              str(tmp / "final")], env_for(), tmp / "out.txt")
    assert proc.wait(timeout=300) == 0, (tmp / "out.txt").read_text()[-3000:]
    return final(tmp / "final")


def ledger_restarts(root: Path, job: str) -> list[tuple[str, str]]:
    lines = (protocol.state_dir(root / "ckpt", job) / protocol.LEDGER).read_text().splitlines()
    found = [dict(w.split("=", 1) for w in ln.split()[1:]) for ln in lines
             if ln.startswith("restart ")]
    return [(r["cause"], r["mode"]) for r in found]


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "deepspeed"])
def test_the_plainest_dp_loop_restarts_in_its_processes_under_every_launcher(
        cluster, launcher: str, undisturbed: list, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    job = submit_example(root, plain_spec(root, launcher, FAULTS))
    log = root / f"job-{job}.out"
    assert wait_done(job, 300) == "COMPLETED", log.read_text()[-5000:]
    text = log.read_text()
    # one Slurm run: every fault was restarted in the allocation, none requeued
    assert sacct_states(job) == ["COMPLETED"], text[-3000:]
    starts = events(root / "events.jsonl", "start")
    assert [(s["attempt"], s["step"]) for s in starts] == [
        (0, 0), (1, 20), (2, 20), (3, 25), (4, 30)], (starts, text[-4000:])
    assert len({s["pid"] for s in starts}) == 1, "the same processes: no new step"
    assert ledger_restarts(root, job) == [("user_crash", "inprocess"), ("hang", "inprocess"),
                                          ("user_crash", "inprocess"), ("hang", "inprocess")], \
        text[-4000:]
    assert "a destroyed process group is still referenced" not in text, text[-4000:]
    assert "not every rank left" not in text, text[-4000:]
    assert {e["step"] for e in events(root / "events.jsonl", "step")} == set(range(TOTAL))
    assert all(torch.equal(a[k], b[k]) for a, b in zip(final(root / "final"), undisturbed)
               for k in a), "bitwise equal to the undisturbed run"


def test_a_crash_that_may_not_restart_ends_failed_never_completed(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_crash_restarts = 0: the supervisor tells the ranks to stop; their exception goes
    on, and however they die (an abort at exit included) the job is FAILED, with the crash
    as its cause, at the step it reached."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    job = submit_example(root, plain_spec(root, "srun", ("crash@20:2:0",),
                                          max_crash_restarts=0))
    log = root / f"job-{job}.out"
    assert wait_done(job, 180) == "FAILED", log.read_text()[-4000:]
    text = log.read_text()
    assert "not restarting attempt 0 in its processes: the decision is to finish " \
           "(user_crash)" in text, text[-4000:]
    assert "restarting" not in text.split("not restarting attempt 0")[1].replace(
        "not restarting", ""), "the log promises no restart that does not follow"
    status = json.loads(subprocess.run([sys.executable, "-m", "hpctrain", "status", job,
                                        "--json"], capture_output=True, text=True,
                                       check=True).stdout)["jobs"][0]
    assert (status["state"], status["cause"]) == ("FAILED", "user_crash"), status
    assert not (root / "final").exists()


def test_by_default_a_crash_is_restarted_once_and_the_same_crash_again_ends_the_job(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_crash_restarts`` left out, under ``hpctrain.runtime.run``: rank 2 raises just
    after the step-20 save, and is restarted in its process (the default retries a
    crash); in that attempt it raises again, at the same step with the same error: a bug,
    not a transient fault. The job ends FAILED with the rule's words, not after 3 more."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    job = submit_example(root, plain_spec(root, "srun", ("crash@20:2:0", "crash@20:2:1"),
                                          max_crash_restarts=None))
    log = root / f"job-{job}.out"
    assert wait_done(job, 180) == "FAILED", log.read_text()[-4000:]
    text = log.read_text()
    assert ledger_restarts(root, job) == [("user_crash", "inprocess")], text[-4000:]
    assert "crashed twice at step 20 with the same error: not transient" in text, text[-4000:]
    status = json.loads(subprocess.run([sys.executable, "-m", "hpctrain", "status", job,
                                        "--json"], capture_output=True, text=True,
                                       check=True).stdout)["jobs"][0]
    assert (status["state"], status["cause"]) == ("FAILED", "user_crash"), status
    starts = [(e["attempt"], e["step"]) for e in events(root / "events.jsonl", "start")]
    assert starts == [(0, 0), (1, 20)], starts


def test_a_requeued_run_that_crashes_as_it_resumes_is_told_from_a_transient_crash(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bug across runs, where the processes are new: no in-place restarts
    (``max_step_restarts = 0``), so the first crash is requeued; rank 1 raises before step
    20 in every attempt of every run, in the requeued run before its first step boundary
    (just after ``load_latest`` resumed step 20). The runtime places that crash at step 20
    from the checkpoint it resumed, the ledger's requeue line keeps the first one's
    signature, and the second run ends FAILED by the rule, not after 3 recoveries."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    job = submit_example(root, plain_spec(root, "srun", ("crash@20:1:*:*",), step_restarts=0,
                                          max_crash_restarts=None))
    log = root / f"job-{job}.out"
    assert wait_done(job, 240) == "FAILED", log.read_text()[-4000:]
    text = log.read_text()
    assert "crashed twice at step 20 with the same error: not transient" in text, text[-4000:]
    assert sacct_states(job) == ["REQUEUED", "FAILED"], sacct_states(job)
    ledger = (protocol.state_dir(root / "ckpt", job) / protocol.LEDGER).read_text()
    assert "requeue cause=user_crash restart_count=1 by=supervisor crash=20:" in ledger, ledger
