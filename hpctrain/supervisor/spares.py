"""Spare nodes (``[elastic] spare_nodes``), the supervisor's acting part: where each step
runs (the batch node first, bad nodes left out, the spares held). Which nodes is
:mod:`hpctrain.supervisor.elastic`'s pure rule; finding a lost node and taking it from the
job is :mod:`hpctrain.supervisor.nodeloss`'s; the decision is the table's lost-node row
(docs/fault-recovery.md, "A lost node and a spare").
"""

from __future__ import annotations

from collections.abc import Sequence

from hpctrain.slurm.view import JobView
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.elastic import resized, step_nodes, with_nodes
from hpctrain.supervisor.gather import Gather
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.nodes import BadNodes
from hpctrain.supervisor.recorder import Recorder
from hpctrain.supervisor.runstate import RunState
from hpctrain.supervisor.scheduler import Scheduler


class Spares:
    """The step's nodes in one run of a job with spare nodes (without: as rendered)."""

    def __init__(self, cfg: Config, slurm: Scheduler, seen: Gather, run: RunState,
                 bad: BadNodes, books: Recorder) -> None:
        self.cfg, self.slurm, self.seen, self.run = cfg, slurm, seen, run
        self.bad, self.books = bad, books
        self.left_out: set[str] = set()          # bad nodes the step runs without

    def nodes_for(self, view: JobView | None, full: bool = False) -> list[str] | None:
        """The nodes the next step runs on (the batch node first, bad ones left out), now
        the run's; None when too few good ones are left (``full``: for the full width, a
        shrink not counted: a node failing the health check is no loss to shrink for)."""
        cfg, run = self.cfg, self.run
        run.on = step_nodes(self.seen.allocated(view), list(self.bad.found), cfg.batch_node,
                            [cfg.nodes] if full else cfg.widths) or []
        return run.on or None

    @property
    def world(self) -> int:
        """The ranks of the step placed now: fewer than the job's after a shrink."""
        cfg = self.cfg
        return len(self.run.on) * (cfg.world // cfg.nodes) if cfg.elastic and self.run.on \
            else cfg.world

    def place(self, argv: Sequence[str], view: JobView | None,
              attempt: int) -> tuple[list[str], str]:
        """The step's argv and where it runs, for the job log: with spare nodes on the
        batch node and the next good ones (``srun --nodelist``), the others held; else as
        rendered. The ledger says where, and names a bad node left out once (status,
        report)."""
        cfg = self.cfg
        port = self.seen.rendezvous.port
        everywhere = cfg.where_on(cfg.nodelist or "?", port)
        if not cfg.elastic:
            return list(argv), everywhere
        nodes = self.nodes_for(view)
        if nodes is None:   # cannot happen after a decision to restart: said, not hidden
            say("too few good nodes left for the step: starting it as rendered")
            return list(argv), everywhere
        for node, why in self.bad.found.items():
            if node not in self.left_out:
                self.left_out.add(node)
                self.books.excluded(node, why)
        world = self.world
        self.books.placed(attempt, nodes, world)   # a rank per GPU, whatever the launcher
        held = [n for n in self.seen.allocated(view) if n not in nodes
                and n not in self.bad.found]
        sized = resized(argv, len(nodes), cfg.nodes)
        assert sized is not None       # cfg.widths offers only the widths it can resize
        if len(nodes) < cfg.nodes:
            dp = world // (cfg.tp * cfg.pp)
            full_dp = cfg.world // (cfg.tp * cfg.pp)
            say(f"shrunk to {len(nodes)} of {cfg.nodes} node(s): no spare left "
                f"([elastic] min_nodes = {cfg.min_nodes}); data parallelism {dp} of {full_dp}, "
                f"each rank taking {full_dp // dp} micro-batch(es) a step to keep the global "
                "batch (ctx.accumulation); the next start asks Slurm for the full size again")
        return with_nodes(sized, nodes), \
            cfg.where_on(f"{','.join(nodes)} (spare: {','.join(held) or 'none'})", port, world)
