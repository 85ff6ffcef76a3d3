"""Restarts inside the running processes (issue 33), on the real devcluster with the real
supervisor: examples/train_gpt.py under hpctrain.runtime.run (``--inprocess``), DP=4 over
2 nodes x 2 fake GPUs (srun), with a snapshot in memory every step, goes through one fault
per attempt of its first run (examples/common.py's ``--fault``):

- attempt 0: rank 1 raises before step 6;
- attempt 1: rank 2 hangs in Python before step 12; the others wait in the all-reduce until
  their collective timeout (collective_timeout_s = 5, shorter than hang_timeout_s = 10)
  and give up: the supervisor names rank 2 (the rank they waited for) and counts a hang;
- attempt 2: the save of step 15 fails on every rank (rank 0's state cannot be pickled);
- attempt 3: rank 3 raises while the others load;
- attempt 4: rank 0 waits in a receive nobody sends before step 19 (stuck in C++, and so
  are the others, in the all-reduce): every rank gives up at its collective timeout, a
  hang nobody can be named for;
- attempt 5: rank 1 freezes (SIGSTOP) before step 24: no Python runs there (it answers no
  stack request), so no restart in these processes; the fallback, as before (that rank's
  node stopped answering: a requeue without it).

Each of the first five restarts in the same processes (the same pids, the same Slurm run,
one srun step), from the snapshot in memory; the run then completes bitwise equal to an
undisturbed local run. Prints the figures: failure -> first step of the next attempt.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import protocol
from helpers.examples import EXAMPLES, example_spec, submit_example
from helpers.jobs import isolate
from helpers.cluster import preempt
from helpers.slurm import sacct_states, wait_done, wait_until
from helpers.reference import gpt_reference_args, reference
from helpers.torchrun import bitwise_equal, events, final_state, records

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
TOTAL, EVERY = 30, 5
FAULTS = ("crash@6:1:0", "hang@12:2:1", "save-crash@15:0:2", "load-crash@0:3:3",
          "collective-hang@19:0:4", "stop@24:1:5")


def test_crashes_and_hangs_restart_in_the_same_processes_and_the_run_stays_bitwise(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    extra = ("--inprocess", "--snapshot-every", "1", "--final-state", str(root / "final"),
             *(w for f in FAULTS for w in ("--fault", f)))
    spec = example_spec(root, name="inprocess", total=TOTAL, save_every=EVERY,
                        step_sleep=0.1, layout={"dp": 4}, launcher="srun", extra=extra,
                        requeue={"max_crash_restarts": 4, "max_hangs": 4})
    spec = spec.replace("[watchdog]\nmax_step_restarts = 2\n",
                        "[watchdog]\nmax_step_restarts = 8\nhang_timeout_s = 10\n"
                        "collective_timeout_s = 5\n")
    spec = spec.replace("[checkpoint]\n", f'[checkpoint]\ndir = "{root / "ckpt"}"\n')
    job = submit_example(root, spec)
    # meanwhile, the same training undisturbed, under a local torchrun
    ref = reference(EXAMPLES / "train_gpt.py", 4, gpt_reference_args(TOTAL))
    assert wait_done(job, 400) == "COMPLETED", (root / f"job-{job}.out").read_text()[-4000:]
    assert ref.wait(timeout=300) == 0, ref.out.read_text()[-3000:]

    log = root / "loss.jsonl"
    starts = events(log, "start")
    first_run = [s for s in starts if s["restart"] == 0]
    # attempts 1, 2, 4 and 5 in rank 0's process (3 failed in its load, before its start
    # line)
    assert [s["attempt"] for s in first_run] == [0, 1, 2, 4, 5], starts
    assert len({s["pid"] for s in first_run}) == 1
    # each from the snapshot in memory: the step the failure was at, not the last save
    assert [s["step"] for s in first_run] == [0, 6, 12, 14, 19], starts
    # the frozen rank: restarted by the fallback (a requeue), in new processes
    assert sacct_states(job) == ["REQUEUED", "COMPLETED"]
    assert starts[-1]["restart"] == 1 and starts[-1]["pid"] != first_run[0]["pid"]

    state = protocol.state_dir(root / "ckpt", job)
    lines = (state / protocol.LEDGER).read_text().splitlines()
    restarts = [dict(w.split("=", 1) for w in ln.split()[1:]) for ln in lines
                if ln.startswith("restart ")]
    assert [(r["cause"], r["mode"]) for r in restarts] == [
        ("user_crash", "inprocess"), ("hang", "inprocess"), ("user_crash", "inprocess"),
        ("user_crash", "inprocess"), ("hang", "inprocess")], lines
    assert any(ln.startswith("requeue cause=hang restart_count=1") for ln in lines), lines
    job_log = (root / f"job-{job}.out").read_text()
    assert "(limit 5 s); stopped first: rank(s) 2 on n2 (the others gave up waiting for them " \
           "in a collective)" in job_log, job_log[-4000:]
    # (the first to give up closes its connections: a rank still waiting then loses its
    # peer, which is no failure of its own either)
    assert re.search(r"rank \d: attempt 1 ended \(timeout: RuntimeError: ", job_log), \
        job_log[-4000:]
    assert not re.search(r"rank \d: attempt 1 ended \(crash", job_log), job_log[-4000:]
    status = json.loads(subprocess.run([sys.executable, "-m", "hpctrain", "status", job,
                                        "--json"], capture_output=True, text=True,
                                       check=True).stdout)["jobs"][0]
    assert status["restarts_in_place"] == {"user_crash": 3, "hang": 2}, status
    assert status["restarts_in_process"] == {"user_crash": 3, "hang": 2}, status
    assert status["requeues"] == {"hang": 1}, status
    # the report says how each attempt began and what getting back to a step cost
    report = subprocess.run([sys.executable, "-m", "hpctrain", "report", job, "--dir",
                             str(root / "ckpt")], capture_output=True, text=True, check=True)
    assert "    attempt 1 (in-process, back in " in report.stdout, report.stdout
    assert "  restarts in the allocation: 5 in-process (median " in report.stdout, report.stdout

    # every step is in the log; the run's parameters equal the undisturbed run's
    steps = {r["step"] for r in records(log) if "loss" in r}
    assert steps == set(range(TOTAL))
    assert bitwise_equal(final_state(root / "final", 4), final_state(ref.path / "ref", 4))

    # figures: the last step of an attempt -> the first step of the next (the first run)
    requeued_at = starts[-1]["time"]
    first = [r for r in records(log) if "loss" in r and r["time"] < requeued_at]
    by_attempt: dict[int, list[float]] = {}
    for r in first:
        by_attempt.setdefault(r["attempt"], []).append(r["time"])
    order = sorted(by_attempt)
    for a, b in zip(order, order[1:]):
        why = {1: "a crash", 2: "a hang (5 s to give up waiting)",
               4: "a failed save, then a failed load",
               5: "a hang inside a collective (5 s to give up waiting)"}
        print(f"in-process restart after {why.get(b, '?')}: "
              f"{min(by_attempt[b]) - max(by_attempt[a]):.1f} s from the last step before "
              "it to the first step after it")


@pytest.mark.parametrize("layout, launcher, inprocess", [
    ({"tp": 2}, "torchrun", False),   # gloo cannot free a DTensor wait: new processes
    ({"pp": 2}, "srun", True),
    ({"pp": 2}, "torchrun", True),    # issue 41: PP x DP in place under every launcher
    ({"pp": 2}, "deepspeed", True),
], ids=["tp2xdp2", "pp2xdp2", "pp2xdp2-torchrun", "pp2xdp2-deepspeed"])
def test_other_layouts_restart_in_place_where_they_can_and_cold_where_not(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: dict[str, int],
        launcher: str, inprocess: bool) -> None:
    """The same script under --inprocess, a crash on one rank, then a Python hang, then a
    device error (CUDA's sticky error, simulated): PP x DP restarts in its processes after
    the first two and in new processes after the device error; TP x DP (gloo) says it
    cannot and restarts in new processes each time at once, as without runtime.run (no
    wait for ranks that cannot leave). Either way the run completes bitwise equal to an
    undisturbed one. Then the job is preempted: it saves, is requeued and resumes, as a
    job without runtime.run would."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    total = 30
    extra = ("--inprocess", "--snapshot-every", "1", "--final-state", str(root / "final"),
             "--fault", "crash@5:1:0", "--fault", "hang@10:2:1",
             "--fault", "device-error@14:3:2")
    spec = example_spec(root, name="layouts", total=total, save_every=EVERY,
                        step_sleep=0.1, layout=layout, launcher=launcher, extra=extra,
                        requeue={"max_crash_restarts": 2, "max_hangs": 2})
    # tp=2 restarts in new processes: torchrun's teardown of a crashed step once took over
    # 10 s on a loaded 2-core machine (3 test workers) and was taken for a hang (1 full run
    # of 4); 20 s leaves it room, and the hang is still found well within the wait below
    hang_s = 10 if inprocess else 20
    spec = spec.replace("[watchdog]\nmax_step_restarts = 2\n",
                        f"[watchdog]\nmax_step_restarts = 4\nhang_timeout_s = {hang_s}\n")
    spec = spec.replace("[checkpoint]\n", f'[checkpoint]\ndir = "{root / "ckpt"}"\n')
    job = submit_example(root, spec)
    # the same training undisturbed (the pp cases share one run)
    ref = reference(EXAMPLES / "train_gpt.py", 4, gpt_reference_args(total),
                    tp=layout.get("tp", 1), pp=layout.get("pp", 1))
    steps = root / "loss.jsonl"
    wait_until(lambda: any(r.get("attempt") == 3 and r["step"] >= 12 for r in records(steps)
                           if "loss" in r), 240, "the last attempt's steps")
    preempt(job)
    assert wait_done(job, 300) == "COMPLETED", (root / f"job-{job}.out").read_text()[-4000:]
    assert ref.wait(timeout=300) == 0, ref.out.read_text()[-3000:]
    state = protocol.state_dir(root / "ckpt", job)
    lines = (state / protocol.LEDGER).read_text().splitlines()
    restarts = [dict(w.split("=", 1) for w in ln.split()[1:]) for ln in lines
                if ln.startswith("restart ")]
    assert [(r["cause"], r.get("mode", "new")) for r in restarts] == [
        ("user_crash", "inprocess" if inprocess else "new"),
        ("hang", "inprocess" if inprocess else "new"), ("user_crash", "new")], lines
    # one Slurm run until the preemption: the restarts were inside the allocation
    assert [ln.split()[:2] for ln in lines if ln.startswith("requeue ")] == [
        ["requeue", "cause=preemption"]], lines
    starts = events(steps, "start")
    assert [s["restart"] for s in starts].count(0) == 4, starts   # an attempt each
    assert len({s["pid"] for s in starts}) == (3 if inprocess else 5), starts
    # resumed from the emergency save of the step it was preempted in: no step lost
    stop = events(steps, "stop")
    assert len(stop) == 1 and starts[-1]["step"] == stop[0]["step"], (stop, starts)
    assert {r["step"] for r in records(steps) if "loss" in r} == set(range(total))
    log = (root / f"job-{job}.out").read_text()
    assert ("no restarts in these processes: tp=2 on gloo" in log) is not inprocess, log[-3000:]
    assert "not every rank left" not in log, "no wait for ranks that cannot leave"
    if inprocess:
        assert "rank 3: a device error: this process cannot start another attempt" in log
        assert "not restarting attempt 2 in its processes: a rank's process cannot (a " \
               "device error)" in log, log[-3000:]
    assert bitwise_equal(final_state(root / "final", 4), final_state(ref.path / "ref", 4))
