"""Slow nodes, the supervisor's acting part: every LOOK_S while the step runs, the ranks'
own time per step is judged (:mod:`hpctrain.supervisor.slow`, pure), and a node found slow
is said in the job log with the evidence, entered in the ledger (``status`` marks it with
its factor) and given what ``[health] on_slow`` says:

- ``replace`` (the default with a spare left): the step ends without it and starts again
  on the spare, in this allocation, as for a lost node (:meth:`NodeLoss.take_out
  <hpctrain.supervisor.nodeloss.NodeLoss.take_out>`; the decision table's row node-slow);
  the node is given back to Slurm and a requeue leaves it out;
- ``exclude``: noted bad, so the job's next start (a requeue) leaves it out; this run goes on;
- ``report`` (the default without a spare): said, nothing more.

The batch node is never replaced (the supervisor and the rendezvous are there): it is
reported, and a requeue leaves it out. A job never stops for a slow node.
"""

from __future__ import annotations

from hpctrain.supervisor.config import Config
from hpctrain.supervisor.gather import Gather
from hpctrain.supervisor.hang import Watch
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.nodeloss import NodeLoss
from hpctrain.supervisor.nodes import BadNodes
from hpctrain.supervisor.recorder import Recorder
from hpctrain.supervisor.runstate import RunState
from hpctrain.supervisor.scheduler import Scheduler, StepProcess
from hpctrain.supervisor.slow import LOOK_S, Finding, SlowWatch


class SlowNodes:
    """One run's slow nodes: watched attempt by attempt, acted on by policy."""

    def __init__(self, cfg: Config, slurm: Scheduler, seen: Gather, run: RunState,
                 bad: BadNodes, books: Recorder, losses: NodeLoss) -> None:
        self.cfg, self.slurm, self.seen, self.run = cfg, slurm, seen, run
        self.bad, self.books, self.losses = bad, books, losses
        self.watch = SlowWatch(cfg.slow_rule)
        self.attempt = 0
        self._next = 0.0

    @property
    def policy(self) -> str:
        """``[health] on_slow``; left out: replace with a spare node, else report."""
        return self.cfg.on_slow or ("replace" if self.cfg.spare_nodes else "report")

    def begin(self, attempt: int) -> None:
        """A new attempt: its pace is judged afresh (its ranks start their figures anew)."""
        self.watch, self.attempt = SlowWatch(self.cfg.slow_rule), attempt

    def look(self, step: StepProcess, watch: Watch) -> int | None:
        """At most every LOOK_S: the nodes found slow, each said and acted on; the step's
        status when a node was taken out (the step ended), else None."""
        if self.slurm.monotonic() < self._next:
            return None
        self._next = self.slurm.monotonic() + LOOK_S
        for finding in self.watch.look(watch.records(), self.slurm.time()):
            status = self.found(step, finding)
            if status is not None:
                return status
        return None

    def found(self, step: StepProcess, f: Finding) -> int | None:
        """Say ``f``, enter it, act on it by policy; the step's status if it ended."""
        if not f.node:
            say(f"the whole job runs {f.factor:.2f}x slower than its own pace earlier: "
                f"{f.evidence()}; every node alike, no node to blame (nothing done)")
            self.books.slow("", f.factor, f.own_s, f.others_s, self.attempt, "report")
            return None
        action, why = self.action(f.node)
        say(f"slow node {f.node}: {f.evidence()}; {why}")
        self.books.slow(f.node, f.factor, f.own_s, f.others_s, self.attempt, action)
        if action == "replace":
            return self.losses.take_out(step, (f.node,), "slow")
        if action == "exclude":
            self.bad.note({f.node: "slow"})
        return None

    def action(self, node: str) -> tuple[str, str]:
        """(what ``node`` gets, the job log's words for it)."""
        policy = self.policy
        if policy == "replace" and node == self.cfg.batch_node:
            return "exclude", "it is the batch node (the supervisor and the rendezvous are " \
                              "there): not replaced; a requeue will leave it out"
        if policy == "replace" and not self.spare_left():
            return "exclude", "no spare node is left to replace it: a requeue will leave it out"
        return policy, {
            "replace": "replacing it by a spare node ([health] on_slow = replace)",
            "exclude": "a requeue will leave it out ([health] on_slow = exclude)",
            "report": "nothing done ([health] on_slow = report; set it to replace with a "
                      "spare node, or to exclude)"}[policy]

    def spare_left(self) -> bool:
        """Is a good node of the allocation held, not running the step?"""
        allocated = self.seen.allocated(self.seen.ask())
        return any(n not in self.run.on and n not in self.bad.found for n in allocated)
