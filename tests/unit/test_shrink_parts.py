"""Shrinking without a spare ([elastic] min_nodes, issue 57), its pure parts: which widths a
layout may shrink to, whose state each rank of a shrunk step takes, the spec's checks, the
accumulation the ranks read, the peer-copy plan with those sources, and how the ledger,
``status`` and ``report`` show a shrink. The supervisor's acts: test_supervisor_shrink.py."""

from __future__ import annotations

import pytest

from hpctrain import protocol as p
from hpctrain.checkpoint.remap import saved_rank, shrunk_sources
from hpctrain.checkpoint.peerplan import Held, restore_plan
from hpctrain.errors import LayoutError, SpecError
from hpctrain.jobs.accounting import RunFacts
from hpctrain.mesh import shrink_widths, source_rank
from hpctrain.protocol.ledger import parse_ledger
from hpctrain.report.build import build
from hpctrain.runtime.environment import Environment
from hpctrain.spec.elastic import ElasticSpec
from hpctrain.spec.layout import plan_layout
from hpctrain.spec.model import JobSpec
from hpctrain.spec.partitions import Partition


def test_the_widths_keep_whole_model_parallel_groups_and_the_global_batch() -> None:
    assert shrink_widths(2, 1, 2, 1, 1) == [1]                 # dp 4 -> 2
    assert shrink_widths(4, 1, 1, 1, 1) == [2, 1]              # dp 4: 3 would not divide it
    assert shrink_widths(4, 3, 1, 1, 1) == []
    assert shrink_widths(3, 1, 2, 1, 1) == [1]                 # dp 6 -> 2 (4 would not)
    assert shrink_widths(2, 1, 2, 1, 2) == [1]                 # pp 2 x dp 2 -> pp 2 x dp 1
    assert shrink_widths(2, 1, 2, 2, 2) == []                  # tp 2 x pp 2 fills both nodes


def test_a_shrunk_rank_takes_its_stage_and_slice_of_its_replica() -> None:
    # dp only: each rank its own number
    assert [source_rank(r, 1, 2, 1, 4) for r in range(2)] == [0, 1]
    # pp 2 x dp 2 -> pp 2 x dp 1: rank 1 is stage 1 of replica 0, rank 2 at full width
    assert [source_rank(r, 1, 1, 2, 2) for r in range(2)] == [0, 2]
    # tp 2 x dp 4 x pp 2 -> dp 2
    assert [source_rank(r, 2, 2, 2, 4) for r in range(8)] == [0, 1, 2, 3, 8, 9, 10, 11]


def test_the_peer_copies_of_a_shrunk_step_come_from_the_source_ranks() -> None:
    env = {p.FULL_DP: "2", p.TP: "1", p.PP: "2"}
    assert shrunk_sources(2, env) == [0, 2]
    assert shrunk_sources(4, {p.TP: "1", p.PP: "2"}) is None      # at full width
    assert shrunk_sources(2, {**env, p.FULL_DP: "1"}) is None
    held = {"n1": [Held(0, 7, 10, "0.0"), Held(1, 7, 10, "1.0"), Held(2, 7, 10, "2.a.copy"),
                   Held(3, 7, 10, "3.a.copy")]}
    plan = restore_plan(["n1", "n1"], held, 5, sources=[0, 2])
    assert [r.step for r in plan.routes] == [7, 7]
    assert [r.local for r in plan.routes] == ["0.0", "2.a.copy"]
    gone = restore_plan(["n1", "n1"], {"n1": held["n1"][:2]}, 5, sources=[0, 2])
    assert gone.routes[0].step is None and "missing for ranks 2" in gone.line, gone.line


def test_a_durable_step_is_read_by_the_same_stage_at_any_data_parallel_width() -> None:
    """A durable step records its layout: pp=2 saved at dp=4 (8 ranks) loads at dp=1 and
    dp=2 (a shrink, twice), one saved at dp=1 loads at dp=2 (growing back): each rank the
    saved rank of its stage, of the replica with its dp index modulo the saved width (an
    adversarial run's growing back read stage 0's optimizer into stage 1, and the second
    shrink rank 1's own number at width 4)."""
    def env(dp: int, full: int = 0) -> dict[str, str]:
        return {p.TP: "1", p.PP: "2", p.DP: str(dp), **({p.FULL_DP: str(full)} if full else {})}
    full = {"kind": "torch", "tp": 1, "dp": 4, "pp": 2}
    assert [saved_rank(r, 2, full, 8, env(1, 4)) for r in range(2)] == [0, 4]
    assert [saved_rank(r, 4, full, 8, env(2, 4)) for r in range(4)] == [0, 1, 4, 5]
    half = {"kind": "torch", "tp": 1, "dp": 2, "pp": 2, "full_dp": 4}
    assert [saved_rank(r, 2, half, 4, env(1, 4)) for r in range(2)] == [0, 2]
    one = {"kind": "torch", "tp": 1, "dp": 1, "pp": 2, "full_dp": 2}
    assert [saved_rank(r, 4, one, 2, env(2)) for r in range(4)] == [0, 0, 1, 1]
    assert [saved_rank(r, 8, full, 8, env(4)) for r in range(8)] == list(range(8))
    # a world the user changed (no shrink said): each rank its own number, as ever
    assert [saved_rank(r, 4, full, 8, env(2)) for r in range(4)] == [0, 1, 2, 3]
    user = {"kind": "torch", "tp": 1, "dp": 2, "pp": 2}
    assert [saved_rank(r, 8, user, 4, env(4)) for r in range(8)] == list(range(8))
    # ...but growing back to the width a step was saved shrunk from: the replicas' states
    assert [saved_rank(r, 8, half, 4, env(4)) for r in range(8)] == [0, 1, 0, 1, 2, 3, 2, 3]
    from hpctrain.checkpoint.remap import mesh_of
    assert mesh_of(2, env(1, 4)) == {"tp": 1, "dp": 1, "pp": 2, "full_dp": 4}
    assert mesh_of(8, env(4)) == {"tp": 1, "dp": 4, "pp": 2}
    # a step saved before layouts were recorded: the full width's, when the step was shrunk
    old = {"kind": "torch"}
    assert [saved_rank(r, 2, old, 8, {**env(1), p.FULL_DP: "4"}) for r in range(2)] == [0, 4]
    assert [saved_rank(r, 2, old, 2, {**env(1), p.FULL_DP: "4"}) for r in range(2)] == [0, 1]


def test_the_ranks_read_the_accumulation_that_keeps_the_global_batch() -> None:
    base = {"WORLD_SIZE": "2", "RANK": "1", p.DP: "2"}
    assert Environment.from_env(base).accumulation == 1
    shrunk = Environment.from_env({**base, p.FULL_DP: "4"})
    assert (shrunk.accumulation, shrunk.full_dp) == (2, 4)
    with pytest.raises(LayoutError, match="HPCTRAIN_FULL_DP=3 is not a multiple"):
        Environment.from_env({**base, p.FULL_DP: "3"})


def plan(nodes: int, least: object, tp: int = 1, pp: int = 1, launcher: str = "srun"):
    spec = JobSpec.from_dict({
        "name": "s", "partition": "gpu", "nodes": nodes, "gpus_per_node": 2,
        "time": "01:00:00", "run": {"launcher": launcher, "command": ["python", "train.py"]},
        "layout": {"tp": tp, "pp": pp}, "elastic": {"min_nodes": least}})
    return plan_layout(spec, Partition(name="gpu", gpus_per_node=2, cpus_per_node=8,
                                       mem_per_node_gb=64))


def test_the_spec_says_at_submit_when_a_layout_cannot_shrink() -> None:
    from hpctrain.render.script import render_script

    assert plan(2, 1).min_nodes == 1 and plan(2, 1).peer_copies    # copies on with a shrink
    script = render_script(JobSpec.from_dict({
        "name": "s", "partition": "wide", "nodes": 2, "gpus_per_node": 2, "time": "01:00:00",
        "run": {"launcher": "srun", "command": ["python", "train.py"]},
        "elastic": {"min_nodes": 1}}))
    assert "export HPCTRAIN_MIN_NODES=1\n" in script and "#SBATCH --nodes=2\n" in script
    with pytest.raises(LayoutError, match=r"min_nodes=3 is more than nodes=2"):
        plan(2, 3)
    with pytest.raises(LayoutError, match=r"tp=2 x pp=2.*this layout cannot shrink"):
        plan(2, 1, tp=2, pp=2)
    with pytest.raises(LayoutError, match=r"min_nodes=2: no width from 2 down to 2.*set "
                                          r"min_nodes to one of 1"):
        plan(3, 2)                                  # dp 6: 2 nodes would be dp 4
    with pytest.raises(LayoutError, match=r"launcher deepspeed: ZeRO shards the optimizer"):
        plan(2, 1, launcher="deepspeed")
    assert plan(2, 1, launcher="torchrun").min_nodes == 1
    with pytest.raises(SpecError, match=r"elastic.min_nodes=0 must be a whole number >= 1"):
        ElasticSpec.from_dict({"min_nodes": 0})
    assert ElasticSpec.from_dict({"min_nodes": 2}).copies(3)
    assert not ElasticSpec.from_dict({"min_nodes": 2}).copies(2)    # no shrink: no copies


def test_the_ledger_status_and_report_show_a_shrink() -> None:
    from hpctrain.commands.report import format_text

    text = ("step restart_count=0 attempt=0 nodes=n1,n2 gpus=4\n"
            "restart cause=node_fail restart_count=0 attempt=1 at=160\n"
            "step restart_count=0 attempt=1 nodes=n1 gpus=2\n")
    assert parse_ledger(text).shrunk == (2, 4)
    assert parse_ledger(text + "step restart_count=1 attempt=0 nodes=n1,n2 gpus=4\n") \
        .shrunk is None                              # the next run at full size again
    # 4 GPUs for 60 s, then 2 (n2 given back): the second attempt's steps count 2
    run = RunFacts(restart=0, state="COMPLETED", submit=0.0, start=100.0, end=200.0,
                   elapsed_s=100.0, nodes="n[1-2]", gpus=4, gpu_s=60 * 4 + 40 * 2)
    from hpctrain.protocol.ledger import entries
    history = [{"restart": 0, "attempt": 0, "event": "step", "step": i, "t": 110.0 + 10 * i}
               for i in range(5)] + \
              [{"restart": 0, "attempt": 1, "event": "step", "step": 5 + i, "t": 165.0 + 5 * i}
               for i in range(7)]
    r = build("7", [run], entries(text), history)
    first, second = r.runs[0].attempts
    assert (first.gpus, second.gpus, second.shrunk) == (4, 2, True)
    assert (r.shrinks, r.spare_restarts, r.spare_gpu_s) == (1, 0, 0.0)
    assert sum(r.gpu_s.values()) == pytest.approx(r.allocated_gpu_s)
    assert r.gpu_s["kept"] == pytest.approx(first.seconds.get("kept", 0.0) * 4
                                            + second.seconds.get("kept", 0.0) * 2)
    assert second.seconds.get("kept", 0.0) > 0          # the shrunk attempt's steps count
    out = format_text(r)
    assert "on 2 GPU(s), shrunk: no spare left" in out, out
    assert "shrunk: 1 lost node(s) recovered on fewer nodes" in out, out
