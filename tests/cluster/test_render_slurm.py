"""Rendered scripts on the real devcluster: sbatch --test-only, and a real 2-node job.

The 2-node torchrun job (tp=2, dp=2) runs 4 gloo ranks across the emulated nodes;
each rank derives its (pp, dp, tp) coordinates from the exported HPCTRAIN_* layout,
checks them with a collective inside its tp group, and writes what it saw to a file
under the devcluster's shared storage. The test compares that with the Megatron
order written out by hand.
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
from pathlib import Path

import pytest

from hpctrain import protocol
from hpctrain.render.script import render_script as _render_script
from hpctrain.slurm import client
from hpctrain.spec.model import JobSpec
from helpers.slurm import sacct_states, sbatch, wait_done

ROOT = Path(__file__).resolve().parents[2]


def render_script(spec: JobSpec) -> str:
    """As `hpctrain render` makes it here: the job's supervisor runs with this Python."""
    return _render_script(spec, python=sys.executable)
EXAMPLES = sorted((ROOT / "sbatch").glob("*.toml"))

RANK_PROBE = r'''
import json, os, socket, sys
import torch
import torch.distributed as dist
from hpctrain.spec.layout import rank_to_coords

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
tp, pp, dp = (int(os.environ[f"HPCTRAIN_{k}"]) for k in ("TP", "PP", "DP"))
coords = rank_to_coords(rank, tp, dp, pp)
# every rank builds every tp group (new_group is collective), then sums ranks in its own
groups = {}
for p in range(pp):
    for d in range(dp):
        ranks = [(p * dp + d) * tp + t for t in range(tp)]
        groups[(p, d)] = (ranks, dist.new_group(ranks))
ranks, group = groups[(coords.pp, coords.dp)]
total = torch.tensor([rank])
dist.all_reduce(total, group=group)
record = {"rank": rank, "world": world, "coords": list(coords), "tp_group": ranks,
          "tp_group_sum": int(total.item()), "node": os.environ.get("SLURMD_NODENAME"),
          "local_rank": int(os.environ["LOCAL_RANK"]), "tp": tp, "pp": pp, "dp": dp}
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
dist.barrier()
dist.destroy_process_group()
'''


@pytest.mark.slurm
@pytest.mark.parametrize("spec_path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_pass_sbatch_test_only(cluster, spec_path: Path) -> None:
    script = render_script(JobSpec.load(spec_path))
    res = client.run(["sbatch", "--test-only"], input=script, check=False)
    assert res.returncode == 0, res.stderr
    assert "to start at" in res.stderr


@pytest.mark.slurm
def test_templates_check_slurm_passes(cluster, capsys: pytest.CaptureFixture[str]) -> None:
    from hpctrain.cli import main
    assert main(["templates", "check", "--slurm"]) == 0
    out = capsys.readouterr().out
    assert "ok    debug      container runtime oci" in out   # srun --container, oci.conf
    assert "ok    debug      torchrun  in a oci container" in out


@pytest.mark.slurm
def test_sbatch_refuses_what_the_cluster_cannot_hold(cluster) -> None:
    """--test-only really validates: 3 GPUs per node do not exist on the devcluster."""
    spec = JobSpec.load(EXAMPLES[0])
    script = render_script(spec).replace("--gpus-per-node=2", "--gpus-per-node=3")
    res = client.run(["sbatch", "--test-only"], input=script, check=False)
    assert res.returncode != 0


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
def test_two_node_torchrun_job_ranks_see_their_coordinates(cluster) -> None:
    work = Path(tempfile.mkdtemp(prefix="render-e2e-", dir=cluster.shared_dir))
    out_dir = work / "ranks"
    out_dir.mkdir()
    probe = work / "probe.py"
    probe.write_text(RANK_PROBE)
    spec = JobSpec.from_dict({
        "name": "render-e2e", "partition": "debug", "nodes": 2, "time": "00:05:00",
        "output": f"{work}/job-%j.out",
        "layout": {"tp": 2, "dp": 2},
        "run": {"launcher": "torchrun", "command": [sys.executable, str(probe), str(out_dir)],
                "env": {"OMP_NUM_THREADS": "1"}},
        "checkpoint": {"dir": f"{work}/ckpt", "stripe_count": 2},
        "requeue": {"signal_lead_s": 30},
    })
    script = work / "job.sbatch"
    script.write_text(render_script(spec))
    job_id = sbatch(str(script))
    state = wait_done(job_id, timeout_s=180)
    log = next(work.glob("job-*.out")).read_text()
    assert state == "COMPLETED", log
    records = {r["rank"]: r for r in (json.loads(p.read_text()) for p in out_dir.glob("*.json"))}
    assert sorted(records) == [0, 1, 2, 3], log
    # Megatron order, written out by hand: tp fastest, then dp (pp = 1)
    expected = {0: [0, 0, 0], 1: [0, 0, 1], 2: [0, 1, 0], 3: [0, 1, 1]}
    for rank, rec in records.items():
        assert rec["world"] == 4 and (rec["tp"], rec["pp"], rec["dp"]) == (2, 1, 2)
        assert rec["coords"] == expected[rank]
        assert rec["tp_group"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert rec["tp_group_sum"] == sum(rec["tp_group"])
        assert rec["local_rank"] == rank % 2
    # a tp group never crosses a node, and the job spans both nodes
    assert records[0]["node"] == records[1]["node"]
    assert records[2]["node"] == records[3]["node"]
    assert {r["node"] for r in records.values()} == {"n1", "n2"}
    assert (work / "ckpt").is_dir()
    assert "hpctrain: training step exited with status 0" in log
    # the rendezvous is hosted by the allocation's first node (torchrun then sets the
    # workers' MASTER_ADDR to its own store host, so the batch log is where to look)
    assert f"rendezvous n1:{protocol.master_port(job_id)}" in log


def _log_has(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text()


@pytest.mark.slurm
@pytest.mark.slow
def test_preempted_job_requeues_itself_and_scancel_ends_it(
        cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain `sbatch` of a rendered script on the real scheduler: urgent preempts a debug
    job, whose supervisor requeues it (restart 1 follows); a plain scancel then ends it
    for good (never undone)."""
    from helpers.slurm import squeue_state, wait_until

    work = Path(tempfile.mkdtemp(prefix="render-preempt-", dir=cluster.shared_dir))
    monkeypatch.chdir(work)  # the submit dir gets the script's requeue ledger

    def job(name: str, partition: str, nodes: int, seconds: int) -> str:
        spec = JobSpec.from_dict({
            "name": name, "partition": partition, "nodes": nodes, "time": "00:05:00",
            "output": f"{work}/{name}-%j.out", "resources": {"exclusive": True},
            "run": {"launcher": "srun", "command": ["sleep", str(seconds)]},
            "requeue": {"signal_lead_s": 30, "max_requeues": 3}})
        path = work / f"{name}.sbatch"
        path.write_text(render_script(spec))
        return sbatch(str(path))

    low, high = job("low", "debug", 2, 300), ""
    log = work / f"low-{low}.out"
    try:
        # other tests may hold the nodes: give the exclusive job time to start
        wait_until(lambda: _log_has(log, "restart 0"), 180, "the debug job to start")
        high = job("high", "urgent", 1, 1)
        wait_until(lambda: _log_has(log, "requeueing job"), 60, "the preempted job to requeue")
        assert wait_done(high, timeout_s=60) == "COMPLETED"
        # the devcluster releases requeued jobs after ~6 s
        try:
            wait_until(lambda: _log_has(log, "restart 1, after a preemption"), 90,
                       "the requeued job to restart")
        except AssertionError as exc:     # what held it: Slurm's reason, the nodes' states
            held = client.run(["scontrol", "show", "job", low], check=False).stdout
            nodes = client.run(["sinfo", "-N", "-h"], check=False).stdout
            raise AssertionError(f"{exc}\n{held}\n{nodes}\n{log.read_text()[-3000:]}") from None
        client.run(["scancel", low])
        wait_until(lambda: squeue_state(low) == "", 60, "the cancelled job to leave the queue")
    finally:
        client.run(["scancel", low, *([high] if high else [])], check=False)
    text = log.read_text()
    assert "after a preemption (restart 1 of max_requeues=3" in text
    assert f"job {low} ends: cancelled" in text and "restart 2" not in text
    assert sacct_states(low) == ["REQUEUED", "CANCELLED"]


@pytest.mark.slurm
@pytest.mark.slow
def test_time_limit_signal_requeues_until_the_budget_is_spent(
        cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """--signal=B:USR2@45 on a 1-minute job: the supervisor passes USR2 on to every rank,
    requeues once (max_requeues=1), then says the limit was hit."""
    work = Path(tempfile.mkdtemp(prefix="render-timelimit-", dir=cluster.shared_dir))
    monkeypatch.chdir(work)  # the submit dir gets the script's requeue ledger
    spec = JobSpec.from_dict({
        "name": "timelimit", "partition": "urgent", "nodes": 1, "time": "1",
        "output": f"{work}/tl-%j.out",
        "run": {"launcher": "srun", "command": ["sleep", "300"]},
        "requeue": {"signal": "USR2", "signal_lead_s": 45, "max_requeues": 1}})
    path = work / "tl.sbatch"
    path.write_text(render_script(spec))
    job_id = sbatch(str(path))
    try:
        state = wait_done(job_id, timeout_s=180)
    finally:
        client.run(["scancel", job_id], check=False)
    text = (work / f"tl-{job_id}.out").read_text()
    forwarded = ("caught SIGUSR2 (time_limit); asking the training step to stop: SIGUSR2 to "
                 "every rank (scancel --signal)")
    assert text.count(forwarded) == 2, text
    assert "requeueing job" in text and "time_limit (restart 1 of max_requeues=1," in text
    assert "not requeueing job" in text and "max_requeues=1 reached (this is restart 2)" in text
    assert text.count("training step exited with status 140") == 2   # 128 + SIGUSR2
    assert state == "FAILED"


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("launcher, mode", [("srun", "--inprocess"), ("torchrun", "")],
                         ids=["srun-rank0-store", "torchrun-c10d-store"])
def test_a_rendezvous_port_taken_after_the_check_moves_to_the_next_not_a_crash(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str,
        mode: str) -> None:
    """The job's port is taken between the script's check and the bind: held by a socket
    that is bound but not listening, as a process that binds it a moment after the check
    (the check connects, is refused, and passes it as free). Rank 0's TCPStore (srun,
    hpctrain.runtime.run's store) or the first node's torchrun agent (c10d) fails to bind
    it (EADDRINUSE); the supervisor finds the port still taken and starts the step again on
    the next one, counted against no limit, and the 2-node job completes."""
    from helpers.cluster import job_log, status, submit
    from helpers.jobs import isolate

    root = isolate(monkeypatch, tmp_path, shared=True)
    command = [sys.executable, str(ROOT / "tests" / "programs" / "allreduce_steps.py"),
               "--steps", "2", "--ckpt-dir", str(root / "ckpt"), "--events",
               str(root / "events.jsonl"), *([mode] if mode else [])]
    spec = JobSpec.from_dict({
        "name": f"port-{launcher}", "partition": "debug", "nodes": 2, "gpus_per_node": 1,
        "time": "00:05:00", "output": f"{root}/job-%j.out", "workdir": str(root),
        "run": {"launcher": launcher, "command": command, "env": {"OMP_NUM_THREADS": "1"}},
        "checkpoint": {"dir": str(root / "ckpt")},
        "requeue": {"signal_lead_s": 30}, "sbatch": {"hold": True}})
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for _ in range(5):
        job = submit(root, spec.to_toml())      # held: its port is known before it starts
        port = protocol.master_port(job)
        try:
            holder.bind(("0.0.0.0", port))
            break
        except OSError:   # another worker's job listens there: the next job id, another port
            client.run(["scancel", job], check=False)
    else:
        raise AssertionError("five held jobs in a row found their port in use")
    try:
        client.run(["scontrol", "release", job])
        assert wait_done(job, 240) == "COMPLETED", job_log(root, job)
    finally:
        holder.close()
        client.run(["scancel", job], check=False)
    log = job_log(root, job)
    moved = protocol.port_after(port)
    assert "EADDRINUSE" in log, log
    assert (f"restarting the training step in this allocation after a port_taken (on port "
            f"{moved}, counted against no limit): the rendezvous could not bind port {port}"
            in log), log
    assert f"rendezvous n1:{moved}, restart 0, in-place restart 1, after a port_taken" in log
    row = status(job)
    assert row["cause"] == "completed" and row["restarts_in_place"] == {"port_taken": 1}, row
