"""A lost node costs at most the snapshot interval: peer copies of snapshots (issue 42,
item 2), on the real devcluster.

The plainest DP loop (tests/programs/plain_dp_loop.py under ``hpctrain.runtime.run``), DP=4
on partition ``wide`` (n1-n3) with ``[elastic] spare_nodes = 1`` (peer copies on by
default), a snapshot every step and a durable save every 20. n2 is lost for real at step
~25 (its slurmd, stepds and processes killed -9; its node memory taken along). The step
restarts on n1 and the spare n3 in new processes: ranks 0-1 find their own copies in n1's
memory, ranks 2-3 (on n3 now) get theirs from n1, where their partners kept them, each
verified against its checksums. Training resumes at the last step finished before the
loss, not at the durable step 20, and ends bitwise equal to an undisturbed run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from hpctrain import protocol as p
from hpctrain.protocol.channel import LOCAL_DIR
from hpctrain.slurm import client
from helpers import admin
from helpers.cluster import status
from helpers.jobs import isolate
from helpers.lossjobs import submit as submit_spec
from helpers.nodes import lose_node
from helpers.slurm import squeue_state, wait_done, wait_until
from helpers.specs import spec_toml
from helpers.reference import reference
from helpers.torchrun import bitwise_equal, events

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "plain_dp_loop.py"
TOTAL, EVERY = 40, 20


def final(prefix: Path) -> list[dict]:
    return [torch.load(prefix / f"rank-{r}.pt") for r in range(4)]


CASES = [("srun", True, 0), ("torchrun", True, 112), ("srun", False, 0)]


@pytest.mark.parametrize("launcher,copies,ballast", CASES,
                         ids=["srun-peer-copies", "torchrun-112MB-peer-copies",
                              "srun-durable-only"])
def test_a_lost_node_resumes_from_peer_copies_at_the_last_step_done(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str,
        copies: bool, ballast: int) -> None:
    """With peer copies (on by default with a spare): the last step done before the loss,
    under srun with a small state and under torchrun (its rendezvous may seat the ranks
    otherwise on the restart) with 112 MB a rank (each copy on the wire for a good part
    of a step, so the loss catches one mid-send); ``peer_copies = false``: the durable
    step, as before."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    dev = admin.Cluster()
    wait_until(lambda: not client.run(["squeue", "-h", "-o", "%i"]).stdout.strip(), 300,
               "an empty queue (other tests' jobs to finish)", interval_s=2)
    args = ["--steps", str(TOTAL), "--save-every", str(EVERY), "--snapshot-every", "1",
            "--ckpt-dir", str(root / "ckpt"), "--events", str(root / "events.jsonl"),
            "--final", str(root / "final"), *(["--ballast-mb", str(ballast)] if ballast else [])]
    spec = spec_toml(
        name="peer-copies", partition="wide", nodes=2, gpus_per_node=2, time="00:10:00",
        output=f"{root}/job-%j.out", workdir=str(root), layout={"dp": 4},
        run={"launcher": launcher, "command": [sys.executable, str(PROGRAM), *args,
                                             "--step-sleep", "0.2"],
             "env": {"OMP_NUM_THREADS": "1"}},
        checkpoint={"dir": str(root / "ckpt")},
        elastic={"spare_nodes": 1, **({} if copies else {"peer_copies": False})},
        requeue={"max_requeues": 2})
    (root / "spec.toml").write_text(spec)
    # the same loop undisturbed (both cases: one run), done before the job starts: started
    # at the loss, it took the CPU the timed recovery needs (on this 2-core machine, 15.2 s
    # from the loss to the first step on the spare, against 9.6-11.0 s without it); started
    # beside the job, the job could finish before the test had waited for it
    log = root / "events.jsonl"
    paths = {str(root / "ckpt"): "{out}/ckpt", str(log): "{out}/ref.jsonl",
             str(root / "final"): "{out}/ref"}
    ref = reference(PROGRAM, 4, [paths.get(a, a) for a in args])
    assert ref.wait(240) == 0, ref.out.read_text()[-3000:]
    dry = subprocess.run([sys.executable, "-m", "hpctrain", "submit", "spec.toml",
                          "--dry-run"], capture_output=True, text=True, timeout=60)
    assert ("peer copies: each rank's snapshots are also kept" in dry.stdout) == copies, dry.stdout
    res = subprocess.run([sys.executable, "-m", "hpctrain", "submit", "spec.toml", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)["job_id"]
    try:
        wait_until(lambda: max((e["step"] for e in events(log, "step")), default=0) >= 25,
                   240, "step 25")
        lose_node(dev, "n2", job)
        t_lost = time.time()
        state = wait_done(job, 240)
    finally:
        dev.make_nodes_usable()
        if squeue_state(job):
            client.run(["scancel", job], check=False)
    text = (root / f"job-{job}.out").read_text(errors="replace")
    out = "\n".join(x for x in text.splitlines() if x.startswith(("hpctrain:", "srun:")))
    assert state == "COMPLETED", out
    assert "on n1,n3 (spare: none)" in out, out
    starts = events(log, "start")
    finished = [e for e in events(log, "step") if e["time"] < starts[1]["time"]]
    last_done = max(e["step"] for e in finished) + 1     # a step's number + 1: its state
    if copies:
        # the newest whole step: at most two snapshot intervals back, never the durable one
        assert starts[1]["step"] >= last_done - 2 and starts[1]["step"] > EVERY, \
            (starts, last_done, out)
        assert f"peer copies: restoring step {starts[1]['step']} from node memory " \
               f"(durable: {EVERY})" in out, out
        assert "from copies kept on n1" in out, out
    else:
        assert starts[1]["step"] == EVERY, (starts, out)
    assert sorted({e["step"] for e in events(log, "step")}) == list(range(TOTAL))
    row = status(job)
    assert row["cause"] == "completed" and row["restarts_in_place"] == {"node_fail": 1}, row
    assert bitwise_equal(final(ref.path / "ref"), final(root / "final"))
    first = min(e["time"] for e in events(log, "step") if e["time"] > starts[1]["time"])
    kind = f"{launcher}-{ballast}MB-" + ("peer-copies" if copies else "durable-only")
    print(f"\nfigures[{kind}]: loss -> first step on the spare {first - t_lost:.1f} s "
          f"(-> the restarted main's start, its state loaded: {starts[1]['time'] - t_lost:.1f} s); "
          f"resumed at step {starts[1]['step']} (last done before the loss: {last_done}, "
          f"durable: {EVERY}); steps lost {last_done - starts[1]['step']}")
    # the run's copies left the good nodes' memory at its end (n2's went with n2: on the
    # devcluster its directory stays on the one host the emulated nodes share)
    run_id = p.read_record(p.state_dir(root / "ckpt", job) / p.IDENTITY)["run_id"]
    left = sorted(d.name for d in Path("/dev/shm").glob(f"hpctrain-*/{run_id}-*.peer"))
    assert left in ([], [f"{run_id}-0-n2.peer"]), left
    shutil.rmtree(root, ignore_errors=True)


def test_node_memory_too_small_for_the_copies_turns_them_off_and_the_job_completes(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container's 64 MB ``/dev/shm`` killed every rank with SIGBUS once: here the
    nodes' local directory is a 16 MB tmpfs (``HPCTRAIN_LOCAL_DIR``, a site's setting, in
    the environment the job is submitted from) and each rank's state 24 MB. The pages are reserved before they are used, so every
    rank turns its copies off and says why, no rank dies of SIGBUS, and the job completes
    from its own memory and storage."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    small = Path(tempfile.mkdtemp(prefix="hpctrain-smallshm-"))
    small.chmod(0o755)
    admin.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=1777", "tmpfs", str(small)])
    monkeypatch.setenv(LOCAL_DIR, str(small))
    try:
        args = ["--steps", "12", "--save-every", "6", "--snapshot-every", "2",
                "--ballast-mb", "24", "--ckpt-dir", str(root / "ckpt"), "--events",
                str(root / "events.jsonl"), "--step-sleep", "0.1"]
        job = submit_spec(root, spec_toml(
            name="small-shm", partition="wide", nodes=2, gpus_per_node=2, time="00:05:00",
            output=f"{root}/job-%j.out", workdir=str(root), layout={"dp": 4},
            run={"launcher": "srun", "command": [sys.executable, str(PROGRAM), *args],
                 "env": {"OMP_NUM_THREADS": "1"}},
            checkpoint={"dir": str(root / "ckpt")}, elastic={"spare_nodes": 1},
            requeue={"max_requeues": 1}))
        state = wait_done(job, 240)
    finally:
        admin.run(["umount", "-l", str(small)], check=False)
        small.rmdir()
    out = (root / f"job-{job}.out").read_text(errors="replace")
    assert state == "COMPLETED", out[-4000:]
    assert out.count("peer copies off: node memory") == 4, out[-4000:]   # every rank says
    assert "cannot hold this rank's copies" in out and "MB free" in out, out[-4000:]
    assert "Bus error" not in out and "SIGBUS" not in out, out[-4000:]
    assert max(e["step"] for e in events(root / "events.jsonl", "step")) == 11
