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

With ``[health] preflight``, before each run's first step every node of the allocation
times a matrix multiply (:mod:`hpctrain.runtime.preflight`); a node far slower than the
others' median is left out of the step when a spare can take its place (the policy's
``replace`` or ``exclude``), else reported and left out of a requeue.
"""

from __future__ import annotations

import statistics
import sys

from hpctrain.errors import HpctrainError
from hpctrain.protocol import preflight
from hpctrain.protocol.preflight import NodeSpeed
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.gather import Gather
from hpctrain.supervisor.hang import Watch
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.nodeloss import NodeLoss
from hpctrain.supervisor.nodes import BadNodes
from hpctrain.supervisor.recorder import Recorder
from hpctrain.supervisor.runstate import RunState
from hpctrain.supervisor.scheduler import Scheduler, StepProcess
from hpctrain.supervisor.slow import LOOK_S, Finding, SlowWatch, slow_at_start

PREFLIGHT_TIMEOUT_S = 120.0   # the check on every node: start-up (torch) and the GEMM


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
        """A new attempt: its pace is judged afresh (its ranks start their figures anew);
        what the last one's watch saw is said first."""
        self.said()
        self.watch, self.attempt = SlowWatch(self.cfg.slow_rule), attempt

    def said(self) -> None:
        """The job log's line on what the attempt's watch saw (nothing to compare: none)."""
        if seen := self.watch.seen():
            say(f"pace: {seen}")
        self.watch = SlowWatch(self.cfg.slow_rule)

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
        if f.rank is not None:
            say(f"uneven ranks: {f.evidence()}; one rank, not its node (more work given to "
                "that rank, rank 0's logging or an evaluation, or one slow GPU among its "
                "node's: the figures cannot tell which): nothing done")
            return None
        if not f.node:
            say(f"the whole job runs {f.factor:.2f}x slower than its own best pace: "
                f"{f.evidence()}; every node alike, no node to blame (nothing done)")
            self.books.slow("", f.factor, self.attempt, "report", own_s=f.own_s,
                            others_s=f.others_s, since=self.slurm.time() - f.lasted_s)
            return None
        action, why = self.action(f.node)
        say(f"slow node {f.node}: {f.evidence()}; {why}")
        self.books.slow(f.node, f.factor, self.attempt, action, own_s=f.own_s,
                        others_s=f.others_s, since=self.slurm.time() - f.lasted_s)
        if action == "replace":
            return self.losses.take_out(step, (f.node,), "slow")
        if action == "exclude":        # this run goes on with it; a requeue leaves it out
            self.bad.note_later({f.node: "slow"})
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

    # ---- before a run's first step ([health] preflight) -----------------------------------
    def preflight(self, view: JobView | None) -> None:
        """Time a matrix multiply on every node of the allocation; leave the ones far slower
        than the others' median out of the step when a spare can take their place (noted
        bad: the placement and a requeue leave them out), else report them; so too a node that
        does not answer while the others do. An all-reduce across the nodes is timed and
        said. A check that cannot run, or that no node answers, judges nothing: the step
        starts."""
        nodes = self.seen.allocated(view)
        # the all-reduce's port: beside the rendezvous's (the step has not started yet)
        port = self.cfg.master_port + 1 if self.cfg.master_port else 0
        argv = [sys.executable, "-m", preflight.MODULE, f"{preflight.SECONDS:g}", str(port)]
        start = self.slurm.monotonic()
        try:
            out = self.slurm.run_on(argv, nodes, PREFLIGHT_TIMEOUT_S)
        except HpctrainError as exc:
            say(f"preflight could not run ({exc}): the step starts without it")
            return
        speeds = preflight.parse_output(out)
        took = self.slurm.monotonic() - start
        said = ", ".join(f"{n} {speeds[n].gflops:.3g}" for n in nodes if n in speeds)
        quiet = [n for n in nodes if n not in speeds]
        device = next(iter(speeds.values())).device if speeds else "?"
        say(f"preflight: a {preflight.SECONDS:g} s matrix multiply on each node ({device}), "
            f"GFLOP/s: {said or 'no answer'}"
            + (f"; no answer from {','.join(quiet)} (not judged)" if quiet else "")
            + f"; {took:.1f} s in all")
        if len(speeds) < 2 and quiet:
            say(f"preflight's output: {out.strip()[-500:]}")
            return                       # the check itself, not the nodes: nothing judged
        say(allreduce_line(speeds, len(nodes)))
        spares = len(nodes) - self.cfg.nodes - len(self.bad.found)
        if quiet:                        # the others answered: these failed the check
            said_srun = [x for x in out.strip().splitlines() if x.startswith("srun:")]
            if said_srun:
                say(f"preflight's srun said: {' | '.join(said_srun)[-500:]}")
        for node in quiet:
            action = self.leave_out(node, 0.0, spares, "did not answer the preflight (no "
                                    f"rate within {PREFLIGHT_TIMEOUT_S:g} s, or its check "
                                    "failed)", {})
            spares -= action == "replace"
        for node, factor in slow_at_start({n: s.gflops for n, s in speeds.items()},
                                          self.cfg.slow_rule.factor).items():
            others = statistics.median(s.gflops for n, s in speeds.items() if n != node)
            action = self.leave_out(
                node, factor, spares, f"is {factor:.1f}x slower than the others' median "
                f"({speeds[node].gflops:.3g} GFLOP/s against {others:.3g})",
                {"gflops": speeds[node].gflops, "others_gflops": others})
            spares -= action == "replace"

    def leave_out(self, node: str, factor: float, spares: int, what: str,
                  figures: dict[str, float]) -> str:
        """A node the preflight found slow (``factor``) or failing (0): said, entered and
        acted on (:meth:`at_start`); the action."""
        action, why = self.at_start(node, spares)
        say(f"preflight: node {node} {what}; {why}")
        self.books.slow(node, factor, self.attempt, action, **figures)
        if action == "replace":          # bad: the step is placed without it
            self.bad.note({node: "slow"})
        elif action == "exclude":
            self.bad.note_later({node: "slow"})
        return action

    def at_start(self, node: str, spares: int) -> tuple[str, str]:
        """What a node the preflight found slow gets (``spares``: good nodes beyond the
        step's), and the job log's words: left out while a spare can take its place (at
        the start nothing is lost), else by the policy."""
        if self.policy == "report":
            return "report", "nothing done ([health] on_slow = report)"
        if node != self.cfg.batch_node and spares > 0:
            return "replace", "left out of the step: a spare takes its place"
        where = "it is the batch node" if node == self.cfg.batch_node else "no spare is left"
        return "exclude", f"{where}: the run goes on with it, a requeue leaves it out"


def allreduce_line(speeds: dict[str, NodeSpeed], nodes: int) -> str:
    """The job log's line on the preflight's all-reduce across the nodes."""
    done = [s for s in speeds.values() if s.allreduce_s > 0]
    if not done:
        return (f"preflight: the all-reduce across the {nodes} node(s) did not run or did not "
                f"complete within {preflight.ALLREDUCE_TIMEOUT_S:g} s (a node that never "
                "joined, its port taken, or one node): not judged")
    slowest = max(done, key=lambda s: s.allreduce_s)
    return (f"preflight: an all-reduce across {len(done)} node(s) took "
            f"{slowest.allreduce_s * 1e3:.3g} ms ({slowest.busbw:.3g} GB/s bus bandwidth)")
