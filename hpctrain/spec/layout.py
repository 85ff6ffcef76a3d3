"""Parallel layout math: does a tp x pp x dp layout fit the job's GPUs, and who is who.

Global rank order is Megatron's: **tp fastest, then dp, then pp**::

    rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

so the ranks of one tensor-parallel group are consecutive and (because tp divides
gpus_per_node and launchers number ranks node by node) never cross a node. Drawn
out in docs/layouts.md. Everything here is pure arithmetic on the spec and the
partition's facts: no environment, no subprocess. The rank arithmetic itself lives in
hpctrain.mesh (re-exported here) so in-job code can share it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.errors import LayoutError
from hpctrain.mesh import Coords, Mesh, coords_to_rank, divisors, rank_to_coords, shrink_widths
from hpctrain.spec.checks import slurm_time_seconds
from hpctrain.spec.model import JobSpec
from hpctrain.spec.partitions import Partition

__all__ = ["Coords", "LayoutPlan", "Mesh", "coords_to_rank", "plan_layout", "rank_to_coords"]


@dataclass(frozen=True)
class LayoutPlan:
    """A checked layout plus what the allocation and launcher need to realise it."""

    layout: Mesh
    nodes: int
    gpus_per_node: int
    launcher: str
    tasks_per_node: int      # Slurm tasks per node: 1 for torchrun, one per GPU otherwise
    procs_per_task: int      # processes each task starts: gpus_per_node for torchrun, else 1
    partition: str
    time_s: int | None       # None: no time limit
    spare_nodes: int = 0     # held beyond ``nodes`` for a lost one ([elastic])
    peer_copies: bool = False    # snapshots also in a partner node's memory ([elastic])
    min_nodes: int | None = None  # the fewest nodes the step may shrink to ([elastic])

    @property
    def job_nodes(self) -> int:
        """The nodes the job asks Slurm for: the step's and the spares."""
        return self.nodes + self.spare_nodes

    world = property(lambda self: self.layout.world)
    tp = property(lambda self: self.layout.tp)
    dp = property(lambda self: self.layout.dp)
    pp = property(lambda self: self.layout.pp)

    @property
    def ntasks(self) -> int:
        return self.nodes * self.tasks_per_node

    def coords(self, rank: int) -> Coords:
        return self.layout.coords(rank)

    def node_of(self, rank: int) -> int:
        """Index of the node that runs ``rank`` (launchers number ranks node by node)."""
        self.layout.coords(rank)  # range check
        return rank // self.gpus_per_node


def _choices(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)


def plan_layout(spec: JobSpec, partition: Partition) -> LayoutPlan:
    """Check ``spec`` against ``partition`` and return the plan, or raise LayoutError."""
    if partition.gpus_per_node < 1:
        raise LayoutError(f"partition {partition.name!r} has no GPUs (gpus_per_node=0): "
                          "pick a GPU partition")
    gpn = spec.gpus_per_node or partition.gpus_per_node
    if gpn > partition.gpus_per_node:
        raise LayoutError(f"gpus_per_node={gpn} exceeds partition {partition.name!r}'s "
                          f"{partition.gpus_per_node} GPUs per node: use gpus_per_node <= "
                          f"{partition.gpus_per_node}")
    spares = spec.elastic.spare_nodes
    if partition.max_nodes is not None and spec.nodes + spares > partition.max_nodes:
        with_spares = f" + elastic.spare_nodes={spares}" if spares else ""
        fix = "nodes + elastic.spare_nodes" if spares else "nodes"
        raise LayoutError(f"nodes={spec.nodes}{with_spares} exceeds partition "
                          f"{partition.name!r}'s max_nodes={partition.max_nodes}: use "
                          f"{fix} <= {partition.max_nodes}")
    time_s = _check_time(spec, partition)
    layout = _check_layout(spec, gpn)
    _check_shrink(spec, gpn)
    per_node = 1 if spec.run.launcher == "torchrun" else gpn
    return LayoutPlan(layout=layout, nodes=spec.nodes, gpus_per_node=gpn,
                      launcher=spec.run.launcher, tasks_per_node=per_node,
                      procs_per_task=gpn // per_node, partition=partition.name, time_s=time_s,
                      spare_nodes=spares, peer_copies=spec.elastic.copies(spec.nodes),
                      min_nodes=spec.elastic.min_nodes)


def _check_shrink(spec: JobSpec, gpn: int) -> None:
    """``[elastic] min_nodes``: at most ``nodes``, and some smaller width the layout can
    shrink to (whole model-parallel groups, a data-parallel width dividing the full one)."""
    least = spec.elastic.min_nodes
    if least is None or least == spec.nodes:
        return
    if least > spec.nodes:
        raise LayoutError(f"elastic.min_nodes={least} is more than nodes={spec.nodes}: use "
                          f"min_nodes <= {spec.nodes} (the fewest the step may shrink to)")
    if spec.run.launcher == "deepspeed":
        raise LayoutError(f"elastic.min_nodes={least} with launcher deepspeed: ZeRO shards the "
                          "optimizer state across the data-parallel ranks, and DeepSpeed "
                          "refuses to load it at another width: leave min_nodes out (a lost "
                          "node requeues the job) or hold a spare (elastic.spare_nodes)")
    tp, pp = spec.layout.tp, spec.layout.pp
    if not shrink_widths(spec.nodes, least, gpn, tp, pp):
        full_dp = spec.nodes * gpn // (tp * pp)
        could = [n for n in range(spec.nodes - 1, 0, -1)
                 if shrink_widths(spec.nodes, n, gpn, tp, pp)[-1:] == [n]]
        hint = f"set min_nodes to one of {_choices(sorted(could))}" if could else \
            "this layout cannot shrink: leave min_nodes out (a lost node requeues the job)"
        raise LayoutError(
            f"elastic.min_nodes={least}: no width from {spec.nodes - 1} down to {least} "
            f"node(s) holds whole model-parallel groups (tp={tp} x pp={pp}) with a data-"
            f"parallel width dividing dp={full_dp} (the global batch kept by accumulation): "
            f"{hint}")


def _check_time(spec: JobSpec, partition: Partition) -> int | None:
    time_s = slurm_time_seconds(spec.time, "time")
    limit = slurm_time_seconds(partition.max_time, f"partition {partition.name} max_time")
    if limit is not None and (time_s is None or time_s > limit):
        raise LayoutError(f"time={spec.time} exceeds partition {partition.name!r}'s "
                          f"max_time={partition.max_time}: ask for {partition.max_time} or less")
    lead = spec.requeue.signal_lead_s
    if time_s is not None and lead >= time_s:
        raise LayoutError(f"requeue.signal_lead_s={lead} is not shorter than time={spec.time} "
                          f"({time_s} s): lower signal_lead_s or raise time")
    return time_s


def _check_layout(spec: JobSpec, gpn: int) -> Mesh:
    tp, pp, world = spec.layout.tp, spec.layout.pp, spec.nodes * gpn
    if gpn % tp:
        raise LayoutError(f"tp={tp} does not divide gpus_per_node={gpn}: choose tp in "
                          f"{_choices(divisors(gpn))} (tensor parallelism stays inside a node)")
    if world % (tp * pp):
        fits = divisors(world // tp) if world % tp == 0 else [1]
        raise LayoutError(f"tp={tp} x pp={pp} = {tp * pp} does not divide world={world} "
                          f"(nodes={spec.nodes} x gpus_per_node={gpn}): with tp={tp} choose "
                          f"pp in {_choices(fits)}")
    dp = world // (tp * pp)
    want = spec.layout.dp
    if want is not None and want != dp:
        need = want * tp * pp
        hint = (f", or nodes={need // gpn} to get dp={want}" if need % gpn == 0 else "")
        raise LayoutError(f"layout.dp={want} does not match world={world} / (tp={tp} x "
                          f"pp={pp}) = {dp}: set dp={dp} or leave it out{hint}")
    layers, heads = spec.layout.num_layers, spec.layout.num_heads
    if layers is not None and layers % pp:
        ok = [p for p in divisors(layers) if (world // tp) % p == 0]
        raise LayoutError(f"num_layers={layers} is not divisible by pp={pp} (each pipeline "
                          f"stage holds the same number of layers): choose pp in {_choices(ok)}")
    if heads is not None and heads % tp:
        ok = [t for t in divisors(gpn) if heads % t == 0]
        raise LayoutError(f"num_heads={heads} is not divisible by tp={tp} (each tensor-"
                          f"parallel rank holds whole heads): choose tp in {_choices(ok)}")
    return Mesh(tp=tp, dp=dp, pp=pp)
