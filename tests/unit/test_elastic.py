"""Spare nodes (``[elastic] spare_nodes``): the spec, the rendered job, where the step runs,
how a lost node is told from its ranks' silence, and what the decision table makes of it.
The whole path on the real devcluster: tests/cluster/test_elastic_cluster.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hpctrain.errors import LayoutError, SpecError
from hpctrain.render.script import render_script
from hpctrain.runtime.environment import Environment
from hpctrain.spec.model import JobSpec
from hpctrain.supervisor.decision import Budget, Facts, InPlace, decide
from hpctrain.protocol.dialog import Attempt
from hpctrain.protocol.progress import Progress
from hpctrain.supervisor.elastic import last_heard, silent_nodes, step_nodes, with_nodes
from hpctrain.slurm.view import JobView

NOW = 1_800_000_000.0
RUNNING = JobView("42", "RUNNING", "None", 0, None, NOW + 3000, True)
BUDGET = Budget(10, {"preemption": 10, "time_limit": 10, "node_fail": 3, "user_crash": 0,
                     "storage": 3})


def spec(**elastic: Any) -> JobSpec:
    return JobSpec.from_dict({
        "name": "el", "partition": "wide", "nodes": 2, "gpus_per_node": 2, "time": "01:00:00",
        "run": {"launcher": "srun", "command": ["python", "train.py"]},
        **({"elastic": elastic} if elastic else {})})


# ---- the spec and the rendered job ---------------------------------------------------------
def test_the_job_asks_for_the_spares_and_the_step_for_its_own_nodes() -> None:
    script = render_script(spec(spare_nodes=1))
    # no --no-kill: a lost batch node must end the run as without spares (with it, Slurm
    # 22.05 left the job running empty on the other nodes)
    assert "#SBATCH --nodes=3\n" in script and "--no-kill" not in script
    assert "export HPCTRAIN_SPARE_NODES=1\n" in script
    assert "(2 node(s) x 2 GPU(s) + 1 spare node(s))" in script
    # the step says its size in full: srun would take SLURM_NTASKS=6 from the job
    assert "srun --nodes=2 --ntasks=4 --ntasks-per-node=2 " in script
    plain = render_script(spec())
    assert "#SBATCH --nodes=2\n" in plain
    assert "HPCTRAIN_SPARE_NODES" not in plain


@pytest.mark.parametrize("value", [-1, 65, "1", True, 1.5])
def test_a_bad_spare_count_is_refused_with_the_range(value: object) -> None:
    with pytest.raises(SpecError, match=r"elastic.spare_nodes=.* must be a whole number 0..64"):
        spec(spare_nodes=value)


def test_an_unknown_elastic_key_is_refused() -> None:
    with pytest.raises(SpecError, match="spare_node"):
        spec(spare_node=1)


def test_spares_count_against_the_partitions_max_nodes() -> None:
    from hpctrain.spec.layout import plan_layout
    from hpctrain.spec.partitions import Partition

    part = Partition(name="gpu", gpus_per_node=2, cpus_per_node=8, mem_per_node_gb=64,
                     max_nodes=2)
    with pytest.raises(LayoutError, match=r"nodes=2 \+ elastic.spare_nodes=1 exceeds partition "
                                          r"'gpu''s max_nodes=2: use nodes \+ "
                                          r"elastic.spare_nodes <= 2"):
        plan_layout(spec(spare_nodes=1), part)
    assert plan_layout(spec(), part).job_nodes == 2


def test_a_rank_counts_the_steps_nodes_not_the_jobs() -> None:
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
           "SLURM_JOB_NUM_NODES": "3", "SLURM_NTASKS_PER_NODE": "2"}
    e = Environment.from_env(env)
    assert (e.num_nodes, e.local_world_size, e.world_size) == (2, 2, 4)


# ---- where the step runs -------------------------------------------------------------------
def test_the_step_runs_on_the_batch_node_and_the_next_good_ones() -> None:
    assert step_nodes(["n1", "n2", "n3"], [], "n1", [2]) == ["n1", "n2"]
    assert step_nodes(["n1", "n2", "n3"], ["n2"], "n1", [2]) == ["n1", "n3"]
    assert step_nodes(["n2", "n3", "n1"], [], "n1", [2]) == ["n1", "n2"]   # batch node first
    assert step_nodes(["n1", "n2", "n3"], ["n2", "n3"], "n1", [2]) is None  # no spare left


def test_the_placement_goes_right_after_srun() -> None:
    argv = ["srun", "--nodes=2", "--ntasks=4", "bash", "-c", "x", "srun"]
    assert with_nodes(argv, ["n1", "n3"]) == [
        "srun", "--nodelist=n1,n3", "--overlap", "--nodes=2", "--ntasks=4", "bash", "-c", "x",
        "srun"]
    assert with_nodes(["python", "train.py"], ["n1"]) == ["python", "train.py"]


# ---- a lost node: every rank there silent, others heard -------------------------------------
def rec(rank: int, node: str, beat_ago: float, phase: str = "step") -> Progress:
    return Progress(rank, Attempt("run", 0, 0), changed_at=NOW - 30, beat_at=NOW - beat_ago,
                    node=node, phase=phase, step="5")


def test_a_node_whose_every_rank_went_silent_is_lost() -> None:
    nodes = ["n1", "n2"]
    both = {0: rec(0, "n1", 1), 1: rec(1, "n1", 1), 2: rec(2, "n2", 7), 3: rec(3, "n2", 9)}
    assert silent_nodes(both, nodes, NOW, 2.0) == ("n2",)
    # one rank there still beats: its node is not lost (a hang is the watchdog's)
    assert silent_nodes({**both, 3: rec(3, "n2", 1)}, nodes, NOW, 2.0) == ()
    # not quiet long enough: 3 beats, at least 6 s
    assert silent_nodes({**both, 2: rec(2, "n2", 5.5)}, nodes, NOW, 2.0) == ()
    assert silent_nodes(both, nodes, NOW, 3.0) == ()                 # 3 beats of 3 s = 9 s
    # ranks that said their last word are not silent: they left
    said = {**both, 2: rec(2, "n2", 30, "exited"), 3: rec(3, "n2", 30, "restarting")}
    assert silent_nodes(said, nodes, NOW, 2.0) == ()


def test_a_peer_lost_elsewhere_shortens_the_silence_a_lost_node_needs() -> None:
    """A rank that said it lost its peer (its connection closed: the node's processes are
    gone) corroborates the silence: 2 beats, at least 4 s, are enough."""
    nodes = ["n1", "n2"]
    quiet5 = {0: rec(0, "n1", 1), 1: rec(1, "n1", 1), 2: rec(2, "n2", 5), 3: rec(3, "n2", 5)}
    assert silent_nodes(quiet5, nodes, NOW, 2.0) == ()
    lost = {**quiet5, 0: replace(rec(0, "n1", 1, "restarting"), failed="peer")}
    assert silent_nodes(lost, nodes, NOW, 2.0) == ("n2",)
    assert silent_nodes({**lost, 2: rec(2, "n2", 3.5)}, nodes, NOW, 2.0) == ()


def test_a_failed_step_no_lost_node_explains_says_what_was_last_heard_by_node() -> None:
    """Said in the job log when a step with spares fails and no node was found lost (seen
    once: Slurm ended the run NODE_FAIL first): the quietest node first, the unheard ones
    before all, at most SHOWN_NODES named."""
    got = {0: rec(0, "n1", 0.4, "exiting"), 1: rec(1, "n1", 0.6, "exited"),
           2: rec(2, "n3", 13.2), 3: rec(3, "n3", 13.9), 9: rec(9, "elsewhere", 1)}
    assert last_heard(got, ["n1", "n3"], NOW) == (
        "n3: 2 rank(s) step, the newest beat 13.2 s ago; "
        "n1: 2 rank(s) exited/exiting, the newest beat 0.4 s ago")
    assert last_heard(got, ["n1", "n4"], NOW).startswith("n4: never heard; n1: ")
    many = {r: rec(r, f"n{r}", r) for r in range(10)}
    said = last_heard(many, [f"n{r}" for r in range(10)], NOW)
    assert said.startswith("n9: 1 rank(s) step, the newest beat 9.0 s ago; n8")
    assert said.endswith("; 4 more node(s)") and said.count("rank(s)") == 6
    assert last_heard({}, ["n1"], NOW) == "n1: never heard"
    assert last_heard({}, [], NOW) == "no rank heard"


def test_silence_everywhere_is_not_a_lost_node() -> None:
    """The batch node's own ranks silent too: this machine is in trouble (or the records'
    storage is), not one node; the ranks that left their word elsewhere still count."""
    quiet = {0: rec(0, "n1", 20), 1: rec(1, "n2", 20)}
    assert silent_nodes(quiet, ["n1", "n2"], NOW, 2.0) == ()
    left = {0: rec(0, "n1", 20, "exiting"), 1: rec(1, "n2", 20)}
    assert silent_nodes(left, ["n1", "n2"], NOW, 2.0) == ("n2",)


def test_a_node_not_in_the_step_or_without_records_is_not_judged() -> None:
    recs = {0: rec(0, "n1", 1), 1: rec(1, "n3", 30)}
    assert silent_nodes(recs, ["n1", "n2"], NOW, 2.0) == ()


# ---- the decision ---------------------------------------------------------------------------
def facts(**kw: Any) -> Facts:
    base: dict[str, Any] = dict(restart_count=0, requeue_signal="USR2", budget=BUDGET,
                                requeues={}, view=RUNNING, now=NOW, status=1)
    return Facts(**{**base, **kw})


SPARED = InPlace(2, 0, healthy=2, needed=2)


def test_a_lost_node_with_a_spare_left_restarts_in_the_allocation() -> None:
    d = decide(facts(lost=("n2",), inplace=SPARED))
    assert (d.action, d.cause) == ("restart", "node_fail"), d.why
    assert "on a spare node" in d.detail and "n2" in d.why


def test_a_lost_node_without_a_spare_is_requeued_as_before() -> None:
    d = decide(facts(lost=("n3",), inplace=replace(SPARED, healthy=1)))
    assert (d.action, d.cause) == ("requeue", "node_fail"), d.why
    assert "1 good node(s) left of the 2 the step needs: no spare node is left" in d.detail


def test_a_node_after_node_ends_at_max_node_failures() -> None:
    """In-place restarts after a lost node count against max_node_failures (3) as requeues
    do: a run that eats node after node stops."""
    d = decide(facts(lost=("n2",), inplace=SPARED, restarts={"node_fail": 2},
                     requeues={"node_fail": 1}))
    assert (d.action, d.cause) == ("stop", "node_fail"), d.why


def test_with_spares_a_bad_node_is_no_obstacle_while_enough_good_ones_are_left() -> None:
    hang = "rank 2 on n2: heartbeat stopped"
    frozen = replace(SPARED, frozen=("n2",), unhealthy={"n2": "DOWN*"})
    assert decide(facts(hang=hang, inplace=frozen)).action == "restart"
    # without spares the same facts forbid an in-place restart (the node is bad)
    plain = InPlace(2, 0, frozen=("n2",))
    assert decide(facts(hang=hang, inplace=plain)).action == "requeue"


def test_preemption_and_cancellation_come_before_a_lost_node() -> None:
    cancelled = replace(RUNNING, state="COMPLETING", end_time=NOW - 1)
    from hpctrain.supervisor.decision import Caught
    d = decide(facts(lost=("n2",), inplace=SPARED, view=cancelled, status=143,
                     caught=(Caught("TERM", NOW - 2),)))
    assert (d.action, d.cause) == ("finish", "cancelled")


def test_the_plan_says_what_the_spares_cost() -> None:
    from hpctrain.commands.submit import plan_json, plan_table
    from hpctrain.render.script import render

    plan = render(spec(spare_nodes=1)).plan
    assert "spare nodes: 1 held for a lost one (2 GPU(s) idle until then: 33% of the job's " \
           "GPU-hours, up to 2.0 GPU-h per run); the job asks Slurm for 3 node(s)" \
           in plan_table(plan)
    assert (plan_json(plan)["spare_nodes"], plan_json(plan)["job_nodes"]) == (1, 3)
    assert "spare nodes" not in plan_table(render(spec()).plan)


def test_the_plan_says_what_peer_copies_cost_in_node_memory_as_a_number() -> None:
    """A figure when the spec names the model's size; said too when it may not fit the
    memory the job asks Slurm for (tmpfs pages count against a job's memory limit)."""
    from hpctrain.commands.submit import plan_table
    from hpctrain.render.script import render
    from hpctrain.spec.workload import ModelSpec

    plan = render(spec(spare_nodes=1)).plan
    assert plan.peer_copies and "up to 4 copies of each rank's snapshot" in plan_table(plan)
    model = ModelSpec.from_dict({"params": 1e9})
    # 1e9 x 12 bytes / (tp x pp = 1) a rank's snapshot, 4 copies x 2 ranks a node
    text = plan_table(plan, model=model)
    assert "about 89.4 GiB a node for 1e+09 parameters (11.18 GiB a rank's snapshot" in text
    assert "more than half" not in text
    tight = plan_table(plan, model=model, memory=("mem", "65536M"))
    assert "more than half the job's memory request (65536M a node)" in tight
