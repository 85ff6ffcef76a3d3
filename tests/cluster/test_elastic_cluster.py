"""A lost node and a spare, on the real devcluster (partition ``wide``: n1-n3).

A DP=4 job (examples/train_gpt.py, srun) asks for 2 nodes + ``[elastic] spare_nodes = 1``
and runs its step on n1,n2. n2 is killed for real mid-run (its slurmd, then every process
it started, kill -9, as tests/cluster/test_recovery_cluster.py does). The supervisor finds
n2's ranks silent within seconds, ends the step, and starts it again on n1 and the spare
n3 in the same allocation: one Slurm run, COMPLETED, no requeue. The run resumes from the
last periodic checkpoint and its final model equals an uninterrupted local run's, bit for
bit. ``status`` shows the restart (node_fail) and n2 left out. Then n3 is lost too: no
spare is left, and the job is requeued as it would be without spares (never worse off); it
resumes on the nodes brought back and completes, still bitwise equal. The same first loss
for a loop under ``hpctrain.runtime.run`` (in-process restarts). Prints the figure: seconds
from the node's loss to the first resumed step, in the allocation.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hpctrain.jobs.poll import last_checkpoint_step
from hpctrain.slurm import client
from helpers import admin
from helpers.cluster import status
from helpers.examples import example_spec, submit_example
from helpers.jobs import isolate
from helpers.nodes import bring_back, lose_node
from helpers.slurm import sacct_states, squeue_state, wait_done, wait_until
from helpers.reference import Reference, gpt_reference_args, reference
from helpers.torchrun import EXAMPLES, bitwise_equal, events, final_state, records, steps

TOTAL, EVERY = 30, 10
LOST, LAST = "n2", "n3"     # the step's second node, then the spare that replaced it


def job_out(root: Path, job: str) -> str:
    """The supervisor's and srun's lines of the job's log, whole (the ranks' tracebacks,
    which a lost peer fills it with, only at the end: the last 3000 characters)."""
    path = root / f"job-{job}.out"
    if not path.exists():
        return "(no job output)"
    text = path.read_text(errors="replace")
    ours = [line for line in text.splitlines() if line.startswith(("hpctrain:", "srun:"))]
    return "\n".join(ours) + "\n--- the log's end ---\n" + text[-3000:]


def sruns_of(root: Path) -> list[int]:
    """The srun processes still running a command of this test's job (by its paths)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"srun") and any(str(root).encode() in a for a in argv):
            found.append(int(pid))
    return found


def before(log: Path, t: float) -> int:
    """The last step the log says was done before wall time ``t``."""
    return max(r["step"] for r in records(log) if "loss" in r and r["time"] < t)


def reference_run() -> Reference:
    """The same training, uninterrupted, under a local torchrun (4 ranks, DP=4)."""
    return reference(EXAMPLES / "train_gpt.py", 4, gpt_reference_args(TOTAL))


KINDS = {
    # a runtime script; then the second loss, with no spare left
    "runtime": (),
    # under hpctrain.runtime.run: the survivors wait to restart in their processes, their
    # peers never arrive, and the step is ended as above (first loss only)
    "inprocess": ("--inprocess",),
}


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_lost_node_is_replaced_by_the_spare_in_the_same_allocation(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    log, ckpt, dev = root / "loss.jsonl", root / "ckpt", admin.Cluster()
    second = kind == "runtime"
    # killing n2 under somebody else's job would break their test
    wait_until(lambda: not client.run(["squeue", "-h", "-o", "%i"]).stdout.strip(), 300,
               "an empty queue (other tests' jobs to finish)", interval_s=2)
    job = submit_example(root, example_spec(
        root, name=f"elastic-{kind}", total=TOTAL, save_every=EVERY, step_sleep=0.25,
        layout={"dp": 4}, launcher="srun", partition="wide", elastic={"spare_nodes": 1},
        extra=("--final-state", str(root / "final"), *KINDS[kind])))
    ref = None
    try:
        wait_until(lambda: (last_checkpoint_step(str(ckpt)) or 0) >= EVERY
                   and max(steps(log), default=0) >= EVERY + 1, 240,
                   f"the periodic checkpoint at step {EVERY} and 2 more steps")
        nodes = client.run(["squeue", "-h", "-j", job, "-o", "%N"]).stdout.strip()
        assert nodes == "n[1-3]", nodes
        saved = last_checkpoint_step(str(ckpt))
        lose_node(dev, LOST, job)
        t_lost = time.time()
        ref = reference_run()   # the CPU is idle while the job finds the loss
        if second:
            # resumed on n1 and the spare n3; past the next periodic checkpoint, n3 is lost
            wait_until(lambda: (last_checkpoint_step(str(ckpt)) or 0) >= 2 * EVERY
                       and max(steps(log)) >= 2 * EVERY + 1, 180,
                       f"the periodic checkpoint at step {2 * EVERY} and 2 more steps")
            lose_node(dev, LAST, job)
            wait_until(lambda: squeue_state(job) == "PENDING", 90, "the job requeued")
            bring_back(dev, job)
        state = wait_done(job, 240)
    finally:
        dev.make_nodes_usable()  # slurmd started, node resumed
        if squeue_state(job):
            client.run(["scancel", job], check=False)
    out = job_out(root, job)
    assert state == "COMPLETED", out
    assert not sruns_of(root), "an srun outlived its job"
    assert f"lost node(s) {LOST}" in out and "on n1,n3 (spare: none)" in out, out
    assert f"took {LOST} from the job: it keeps n1,n3" in out, out
    starts = events(log, "start")
    done = steps(log)
    assert sorted(set(done)) == list(range(TOTAL))
    # what was done before each restart (read from the log's times, not when the test
    # killed the node: a step whose all-reduce finished just before may be logged after)
    last_step = before(log, starts[1]["time"])
    rerun = [*range(saved, last_step + 1)]
    row = status(job)
    assert row["cause"] == "completed" and row["restarts_in_place"] == {"node_fail": 1}, row
    assert row["excluded_nodes"] == {LOST: "node_fail"}, row
    # sacct closes a RESIZING row when the supervisor takes a lost node from the job (the
    # run goes on); how many it has closed, and when, is Slurm's bookkeeping (a newcomer's
    # run once saw one row fewer than here): the outcome is asserted, not the rows
    states = sacct_states(job)
    # the second loss (no spare left) ends the run for a requeue: the supervisor finds n3
    # silent and asks for it (a REQUEUED row), or Slurm finds n3 down first and ends the run
    # NODE_FAIL itself (seen once on a loaded machine, 14 s after the loss; the
    # devcluster's SlurmdTimeout is 10 s): the scheduler's word, and the same requeue
    ended = {"RESIZING", "REQUEUED", "NODE_FAIL"} if second else {"RESIZING", "REQUEUED"}
    assert states[-1] == "COMPLETED" and set(states[:-1]) <= ended, (states, out)
    if second:
        assert "NODE_FAIL" in states or "took n3 from the job: it keeps n1" in out, out
        assert [s["step"] for s in starts] == [0, saved, 2 * EVERY], out
        assert [s["last_exit_cause"] for s in starts[1:]] == ["node_fail", "node_fail"], out
        rerun += range(2 * EVERY, before(log, starts[2]["time"]) + 1)
        assert row["requeues"] == {"node_fail": 1}, row
        # n2 was left out of the run; the requeue could not keep the job off n2 and n3
        # (the partition has 3 nodes, the job needs 3: it would never run again), said so
        assert "not excluding n2,n3: partition wide would keep 1 node(s), the job needs 3" \
            in out
    else:
        assert "REQUEUED" not in states, (states, out)      # one Slurm run
        # no attempt in place: the node's silence is found while the survivors wait for
        # it (in-process), or first by its heartbeat (on a loaded machine), as it happens
        assert ("the ranks on n2 went silent: no attempt in place" in out
                or "lost node(s) n2: every rank there stopped its heartbeat" in out), out
        assert [s["step"] for s in starts] == [0, saved], out
        assert row["requeues"] == {}, row
    assert sorted(s for s in set(done) if done.count(s) > 1) == rerun
    losses: dict[int, set[float]] = {}
    for r in records(log):
        if "loss" in r:
            losses.setdefault(r["step"], set()).add(r["loss"])
    assert all(len(v) == 1 for v in losses.values()), "a re-run step got another loss"
    assert ref is not None and ref.wait(300) == 0, ref.out.read_text()[-3000:]
    assert bitwise_equal(final_state(ref.path / "ref", 4), final_state(root / "final", 4))

    first = next(r["time"] for r in records(log) if "loss" in r and r["time"] > t_lost)
    print(f"\nfigures[elastic-{kind}]: seconds from node loss to the first resumed step = "
          f"{first - t_lost:.1f}; steps re-run = {last_step + 1 - saved}")
    assert first - t_lost < 60

