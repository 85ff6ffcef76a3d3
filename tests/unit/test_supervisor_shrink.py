"""No spare left: the step shrinks to the good nodes left ([elastic] min_nodes, issue 57),
driven against the recorded stand-in of Slurm (tests/helpers/fake_scheduler.py): a shrink,
a shrink then a requeue below the minimum, a spare then a shrink; each script kind.

``lose:NODE``: every rank on the node goes silent (the node dark), found by their silence
and taken from the job before Slurm marks it down. tests/cluster/test_shrink_cluster.py
loses a real devcluster node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain import protocol as p
from hpctrain.supervisor.elastic import resized
from helpers.supervise import SPARES, asked, supervise

ARGV = ("srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "python", "train.py")
TWO = dict(allocation=("n1", "n2"), nodes=2, world=4, nodelist="n1,n2", job_nodes=2,
           batch_node="n1", argv=ARGV, min_nodes=1,
           where="{world} rank(s) on {nodes}, rendezvous n1:20042")
# four nodes of one GPU: dp 4 shrinks to 2 (3 would not keep the global batch)
FOUR = dict(allocation=("n1", "n2", "n3", "n4"), nodes=4, world=4, nodelist="n1,n2,n3,n4",
            job_nodes=4, batch_node="n1", min_nodes=2, max_step_restarts=5,
            argv=("srun", "--nodes=4", "--ntasks=4", "python", "train.py"),
            where="{world} rank(s) on {nodes}, rendezvous n1:20042")


def step_envs(fake) -> list[dict[str, str]]:
    return [dict(s.env) for s in fake.started]


# silent (the runtime's heartbeats stop), or its processes killed first and the node then
# dark (a plain script's launcher says so; no heartbeats to miss)
@pytest.mark.parametrize("kind, loss", [("runtime", "lose"), ("inprocess", "lose"),
                                        ("torchrun", "die"), ("srun", "die")])
def test_a_lost_node_without_a_spare_shrinks_the_step_in_the_same_run(
        tmp_path: Path, kind: str, loss: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(5.0, f"{loss}:n2")],
                                            steps=[{"steps": 40}], **TWO)
    err = capsys.readouterr().err
    assert (code, verdict["cause"]) == (0, "completed"), (verdict, err)
    assert asked(fake, "shrink_job") == [("shrink_job", "n1")]
    assert asked(fake, "start_step") == [("start_step", "n1", "n2"), ("start_step", "n1")]
    assert fake.view.restarts == 0 and not asked(fake, "requeue")      # the same run
    first, shrunk = step_envs(fake)
    assert p.FULL_DP not in first
    assert (shrunk[p.WORLD_SIZE], shrunk[p.NODES], shrunk[p.DP], shrunk[p.FULL_DP]) == \
        ("2", "1", "2", "4")
    assert "shrunk to 1 of 2 node(s): no spare left ([elastic] min_nodes = 1)" in err, err
    assert "each rank taking 2 micro-batch(es) a step" in err
    assert "2 rank(s) on n1 (spare: none)" in err
    steps = [line for line in ledger if line.startswith("step ")]
    assert "nodes=n1,n2" in steps[0] and "gpus=4" in steps[0], steps
    assert "nodes=n1 " in steps[1] + " " and "gpus=2" in steps[1], steps
    restart = next(line for line in ledger if line.startswith("restart "))
    assert "cause=node_fail" in restart, ledger


def test_the_launchers_argv_is_resized_or_the_shrink_refused() -> None:
    assert resized(ARGV, 1, 2) == ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2",
                                   "python", "train.py"]
    torchrun = ["srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "bash", "-c", "x",
                "python", "-m", "torch.distributed.run", "--nnodes=4", "--nproc_per_node=2",
                "train.py", "--nodes=4"]
    assert resized(torchrun, 2, 4) == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                                       "bash", "-c", "x", "python", "-m",
                                       "torch.distributed.run", "--nnodes=2",
                                       "--nproc_per_node=2", "train.py", "--nodes=4"]
    # a site's template in a form hpctrain does not render: no shrink, never a wrong world
    assert resized(["srun", "-N", "2", "-n", "4", "python", "x.py"], 1, 2) is None
    agent = ["srun", "--nodes=2", "--ntasks=2", "torchrun"]
    assert resized([*agent, "--nnodes", "2", "x.py"], 1, 2) is None
    assert resized([*agent, "--nnodes=1:2", "x.py"], 1, 2) is None
    assert resized([*agent, "x.py"], 1, 2) is None            # torchrun's own count unsaid
    # a plain script's own --nnodes (no torchrun): its argument, kept
    assert resized(["srun", "--nodes=2", "--ntasks=4", "python", "x.py", "--nnodes=2"], 1, 2) \
        == ["srun", "--nodes=1", "--ntasks=2", "python", "x.py", "--nnodes=2"]
    assert resized(["mpirun", "-np", "4", "x"], 1, 2) is None
    assert resized(ARGV, 2, 2) == list(ARGV)


def test_a_site_argv_that_cannot_be_resized_requeues_as_without_a_shrink(
        tmp_path: Path) -> None:
    code, fake, verdict, _ = supervise(
        tmp_path, "runtime", events=[(5.0, "lose:n2")], steps=[{"steps": 40}],
        **{**TWO, "argv": ("srun", "-N", "2", "-n", "4", "python", "x.py")})
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "requeue"), verdict
    assert "no spare node is left" in verdict["detail"], verdict


def test_shrunk_then_below_the_minimum_is_requeued(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Four nodes, min_nodes 2: n2 lost -> two nodes (dp 4 -> 2; three would not keep the
    global batch), n4 held as a spare is; n3 lost -> n1 and n4, still two; n4 lost -> one
    good node, below the minimum: requeued, as without a shrink."""
    code, fake, verdict, ledger = supervise(
        tmp_path, "runtime", events=[(5.0, "lose:n2"), (40.0, "lose:n3"), (80.0, "lose:n4")],
        steps=[{"steps": 90}], **FOUR)
    err = capsys.readouterr().err
    assert asked(fake, "start_step") == [("start_step", "n1", "n2", "n3", "n4"),
                                         ("start_step", "n1", "n3"), ("start_step", "n1", "n4")]
    assert "2 rank(s) on n1,n3 (spare: n4)" in err, err
    assert "2 rank(s) on n1,n4 (spare: none)" in err, err
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "requeue"), (verdict, err)
    assert "it may shrink to no fewer than 2 ([elastic] min_nodes)" in verdict["detail"], \
        verdict
    assert asked(fake, "requeue") and code == 0
    # Slurm keeps a resized job's smaller size for its next run: the full size asked again
    assert asked(fake, "set_nodes") == [("set_nodes", "4")], fake.calls
    assert "the next run asks Slurm for 4 node(s) again (this one gave back n2,n3,n4)" in err


def test_a_spare_is_used_first_then_the_step_shrinks(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, fake, verdict, ledger = supervise(
        tmp_path, "runtime", events=[(5.0, "lose:n2"), (40.0, "lose:n3")],
        steps=[{"steps": 70}], **{**SPARES, "min_nodes": 1, "argv": ARGV,
                                  "where": "{world} rank(s) on {nodes}, rendezvous n1:20042"})
    err = capsys.readouterr().err
    assert (code, verdict["cause"]) == (0, "completed"), (verdict, err)
    assert asked(fake, "start_step") == [("start_step", "n1", "n2"), ("start_step", "n1", "n3"),
                                         ("start_step", "n1")]
    envs = step_envs(fake)
    assert p.FULL_DP not in envs[1] and envs[2][p.WORLD_SIZE] == "2", envs
    assert err.count("shrunk to 1 of 2 node(s)") == 1, err
    assert not asked(fake, "set_nodes")            # completed: nothing to ask for
    restarts = [line for line in ledger if line.startswith("restart ")]
    assert len(restarts) == 2 and all("cause=node_fail" in r for r in restarts), ledger


@pytest.mark.parametrize("kind", ["runtime", "inprocess"])
def test_the_batch_nodes_silent_ranks_never_leave_a_step_without_it(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The supervisor runs on the batch node: its ranks silent (SIGSTOPped, say) are not a
    lost node. An adversarial run took n1 from the job and started the shrunk step on n2
    around a rendezvous on n1 that was gone: a crash (FAILED). Never a step without it."""
    code, fake, verdict, ledger = supervise(tmp_path, kind, events=[(5.0, "lose:n1")],
                                            steps=[{"steps": 40}], **TWO)
    err = capsys.readouterr().err
    assert ("start_step", "n2") not in asked(fake, "start_step"), (fake.calls, err)
    assert not asked(fake, "shrink_job"), fake.calls
    assert "lost node(s) n1" not in err, err
    assert verdict["action"] in ("requeue", "leave"), (verdict, err)


def test_a_shrunk_step_that_fails_before_its_first_step_is_requeued_at_full_size(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A script that cannot run at a smaller width (DeepSpeed's ZeRO state, sharded across
    the data-parallel ranks, refused a world of 2 where it saved 4: an adversarial run
    ended FAILED) raises at once in the shrunk step: never worse off than without the
    shrink, the job is requeued (node_fail) and asks Slurm for its full size."""
    code, fake, verdict, ledger = supervise(
        tmp_path, "runtime", events=[(5.0, "lose:n2")],
        steps=[{"steps": 40}, {"steps": 40, "crash_at": 0}], **TWO)
    err = capsys.readouterr().err
    assert asked(fake, "start_step") == [("start_step", "n1", "n2"), ("start_step", "n1")]
    assert (verdict["cause"], verdict["action"]) == ("node_fail", "requeue"), (verdict, err)
    assert "the step shrunk to 2 of 4 GPUs ([elastic] min_nodes) failed before any rank " \
           "finished a step" in err, err
    assert asked(fake, "set_nodes") == [("set_nodes", "2")], fake.calls
    # a shrunk step that trained before it crashed is the script's crash, as ever
    code, fake, verdict, _ = supervise(
        tmp_path / "later", "runtime", events=[(5.0, "lose:n2")],
        steps=[{"steps": 40}, {"steps": 40, "crash_at": 5}], **TWO)
    assert verdict["cause"] == "user_crash", verdict


@pytest.mark.parametrize("kind", ["runtime", "inprocess"])
def test_a_batch_node_noted_bad_never_leaves_a_step_without_it(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An adversarial run froze the batch node's ranks for longer than the hang timeout:
    the watchdog noted n1 bad (hang), and the shrink placed the next step on n2 alone,
    around a rendezvous on n1 (a hang again, then a requeue that excluded n1). A batch
    node noted bad leaves no step to place: the job is requeued."""
    code, fake, verdict, ledger = supervise(
        tmp_path, kind, steps=[{"steps": 40, "hang_at": 5, "hung_rank": 0, "frozen": 0}],
        **TWO)
    err = capsys.readouterr().err
    assert ("start_step", "n2") not in asked(fake, "start_step"), (fake.calls, err)
    assert verdict["action"] == "requeue", (verdict, err)
