"""Spare nodes (``[elastic] spare_nodes``), the supervisor's acting part: where each step
runs, and ending a step that lost a node (the node taken from the job first). Which nodes
and when a node is lost are :mod:`hpctrain.supervisor.elastic`'s pure rules; the decision
is the table's lost-node row (docs/fault-recovery.md, "A lost node and a spare").
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from hpctrain.errors import SlurmError
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.elastic import step_nodes, with_nodes
from hpctrain.supervisor.gather import Gather
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.nodes import BadNodes
from hpctrain.supervisor.recorder import Recorder
from hpctrain.supervisor.runstate import RunState
from hpctrain.supervisor.scheduler import Scheduler, StepProcess


class Spares:
    """The step's nodes in one run of a job with spare nodes (without: as rendered)."""

    def __init__(self, cfg: Config, slurm: Scheduler, seen: Gather, run: RunState,
                 bad: BadNodes, books: Recorder) -> None:
        self.cfg, self.slurm, self.seen, self.run = cfg, slurm, seen, run
        self.bad, self.books = bad, books
        self.left_out: set[str] = set()          # bad nodes the step runs without

    def nodes_for(self, view: JobView | None) -> list[str] | None:
        """The nodes the next step runs on (the batch node first, bad ones left out), now
        the run's; None when too few good ones are left."""
        cfg, run = self.cfg, self.run
        run.on = step_nodes(self.seen.allocated(view), list(self.bad.found), cfg.batch_node,
                            cfg.nodes) or []
        run.lost = ()
        return run.on or None

    def place(self, argv: Sequence[str], view: JobView | None,
              attempt: int) -> tuple[list[str], str]:
        """The step's argv and where it runs, for the job log: with spare nodes on the
        batch node and the next good ones (``srun --nodelist``), the others held; else as
        rendered. The ledger says where, and names a bad node left out once (status,
        report)."""
        cfg = self.cfg
        port = self.seen.rendezvous.port
        everywhere = cfg.where_on(cfg.nodelist or "?", port)
        if not cfg.spare_nodes:
            return list(argv), everywhere
        nodes = self.nodes_for(view)
        if nodes is None:   # cannot happen after a decision to restart: said, not hidden
            say("too few good nodes left for the step: starting it as rendered")
            return list(argv), everywhere
        for node, why in self.bad.found.items():
            if node not in self.left_out:
                self.left_out.add(node)
                self.books.excluded(node, why)
        self.books.placed(attempt, nodes, cfg.world)   # a rank per GPU, whatever the launcher
        held = [n for n in self.seen.allocated(view) if n not in nodes
                and n not in self.bad.found]
        return with_nodes(argv, nodes), \
            cfg.where_on(f"{','.join(nodes)} (spare: {','.join(held) or 'none'})", port)

    def abandon(self, step: StepProcess, lost: tuple[str, ...]) -> int:
        """Every rank of ``lost`` went silent: the node is gone. Before Slurm notices (it
        marks the node DOWN after SlurmdTimeout, about 30 s here, and ends the run
        NODE_FAIL), take the node from the job; note it bad; kill the step's processes and
        its srun (the step may linger in Slurm: the next one runs with ``--overlap``). A
        failed step's status."""
        say(f"lost node(s) {','.join(lost)}: every rank there stopped its heartbeat; ending "
            "the step without waiting for Slurm to notice")
        self.run.lost = lost
        self.bad.note({node: "node_fail" for node in lost})
        self.release(lost)
        try:
            steps = self.slurm.step_ids(self.cfg.key)
        except SlurmError as exc:
            say(f"could not list the job's steps ({exc}): leaving them to Slurm")
            steps = []
        # scancel waits out MessageTimeout on the lost node: not on this thread
        threading.Thread(target=self._kill, args=(steps,), daemon=True).start()
        # and the local srun: once the node is no longer the job's, Slurm never tells it
        # the node failed, and it would wait for the lost tasks after the job ended (seen:
        # orphaned sruns outliving their job on the devcluster)
        step.kill_local("KILL")
        return 1

    def release(self, lost: tuple[str, ...]) -> None:
        """Take ``lost`` from the running job (``scontrol update NodeList``), so that Slurm
        marking them DOWN no longer ends it. When Slurm refuses, the run ends NODE_FAIL and
        Slurm requeues it, as without spares."""
        view = self.seen.ask()
        # (without Slurm's view, the allocation at start: leave out every node lost since)
        keep = [n for n in self.seen.allocated(view) if n not in lost
                and self.bad.found.get(n) != "node_fail"]
        try:
            self.slurm.shrink_job(self.cfg.key, keep)
        except SlurmError as exc:
            say(f"could not take {','.join(lost)} from the job ({exc}): Slurm will end this "
                "run NODE_FAIL and requeue it when it marks the node DOWN")
            return
        say(f"took {','.join(lost)} from the job: it keeps {','.join(keep)}")

    def _kill(self, steps: list[str]) -> None:
        for step_id in steps:
            try:
                self.slurm.signal_steps(step_id, "KILL")
            except SlurmError:
                pass   # the lost node's part: Slurm ends it when it marks the node DOWN
