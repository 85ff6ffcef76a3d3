"""A lost node, the supervisor's acting part, in one place. Found one of two ways:

- **silent while the step runs** ([elastic] spare nodes): every rank there stopped its
  heartbeat (:meth:`NodeLoss.silent`); the node is taken from the job before Slurm notices
  and the step ended at once (:meth:`NodeLoss.abandon`);
- **asked once a failed step ended**: the nodes where ranks died without a word while the
  others only lost their peers are asked for a step (:class:`NodeProbe`); no answer: lost;
  an answer: a fault of the node (its ranks were killed), retried once in place without a
  spare and left out with one (:meth:`NodeLoss.at_end`).

Nodes lost or left out are given back to Slurm (:meth:`NodeLoss.release`) so that Slurm
marking them down does not end the run. The rules are pure and elsewhere: which nodes to
ask (:mod:`.lost`), when a node is silent (:mod:`.elastic`), what the job does then (the
decision table's lost-node rows, :mod:`.decision`). Changing how a lost node is handled
means this module and, for what the job does about it, the decision table.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from hpctrain.errors import SlurmError
from hpctrain.protocol.progress import Progress
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.diagnosis import Diagnosis, memory_kill
from hpctrain.supervisor.elastic import last_heard
from hpctrain.supervisor.decision import slurm_event
from hpctrain.supervisor.gather import ASK_DEADLINE_S, POLL_S, QUIET_S, EndNodes, Gather
from hpctrain.supervisor.hang import Watch
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.lost import suspect_nodes
from hpctrain.supervisor.nodes import BadNodes
from hpctrain.supervisor.runstate import RunState
from hpctrain.supervisor.scheduler import NodeAnswers, Scheduler, StepProcess

PROBE_S = 30.0               # a node asked for a step (a lost one fails after MessageTimeout)


class NodeProbe:
    """Before a failed step is called a crash: the nodes where ranks died without a word
    while the others only lost their peers (:func:`hpctrain.supervisor.lost.suspect_nodes`) are
    asked for a step; those that do not answer are lost, and noted bad."""

    def __init__(self, slurm: Scheduler, bad: BadNodes, nodes: Callable[[], list[str]]) -> None:
        self.slurm, self.bad, self.nodes = slurm, bad, nodes   # nodes: the step's, now

    def suspected(self, failure: Diagnosis | None, records: Mapping[int, Progress],
                  log: str) -> tuple[str, ...]:
        """The step's nodes to ask before ``failure`` is called a crash."""
        return suspect_nodes(failure, records, log, self.nodes())

    def start(self, nodes: tuple[str, ...]) -> NodeAnswers:
        """Start asking ``nodes`` for a step, and say so in the job log."""
        say(f"rank(s) on {','.join(nodes)} died without a word and no rank failed of its "
            "own: asking the node(s) for a step before calling it a crash")
        return self.slurm.probe_nodes(list(nodes), PROBE_S)

    def early(self, failure: Diagnosis | None, records: Mapping[int, Progress],
              log: str) -> NodeAnswers | None:
        """The nodes :meth:`judge` will ask, asked already while Slurm is given its time
        to speak (a lost node's answer takes a MessageTimeout: the two waits overlap)."""
        asked = self.suspected(failure, records, log)
        return self.start(asked) if asked else None

    def judge(self, failure: Diagnosis | None, records: Mapping[int, Progress], log: str,
              early: NodeAnswers | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Ask the suspected nodes (``early``: the same nodes asked already) and note the
        ones that did not answer as lost: (those nodes, the ones that answered: their
        ranks died without a word of their own on a node that is up, a fault of the node
        the step loop retries, not a crash of the script)."""
        asked = self.suspected(failure, records, log)
        if not asked:
            return (), ()
        probe = early if early is not None and early.nodes == asked else self.start(asked)
        lost, answered = {}, []
        for node, why in probe.answers().items():
            if why is None:
                say(f"node {node} answered a step: its ranks died there without a word of "
                    "their own (killed), a fault of the node, not of the script")
                answered.append(node)
            else:
                say(f"node {node} did not answer a step launched there ({why}): lost, "
                    "not a crash")
                lost[node] = "node_fail"
        self.bad.note(lost)
        return tuple(lost), tuple(answered)


class NodeLoss:
    """One run's lost nodes: found, taken from the job, and told to the decision."""

    def __init__(self, cfg: Config, slurm: Scheduler, seen: Gather, run: RunState,
                 bad: BadNodes, nodes: Callable[[], list[str]]) -> None:
        self.cfg, self.slurm, self.seen, self.run, self.bad = cfg, slurm, seen, run, bad
        self.probe = NodeProbe(slurm, bad, nodes)
        self._early: NodeAnswers | None = None   # the nodes asked while Slurm speaks

    # ---- while the step runs ---------------------------------------------------------------
    def silent(self, step: StepProcess, watch: Watch) -> int | None:
        """[elastic] A node of the step whose every rank went silent: the step ended now (a
        failed step's status); None while none is."""
        if self.cfg.elastic and (lost := others_silent(watch, self.run.on,
                                                       self.cfg.batch_node)):
            return self.abandon(step, lost)
        return None

    def abandon(self, step: StepProcess, lost: tuple[str, ...]) -> int:
        """Every rank of ``lost`` went silent: the node is gone. Before Slurm notices (it
        marks the node DOWN after SlurmdTimeout, about 30 s here, and ends the run
        NODE_FAIL), take the node from the job; note it bad; kill the step's processes and
        its srun (the step may linger in Slurm: the next one runs with ``--overlap``). A
        failed step's status."""
        say(f"lost node(s) {','.join(lost)}: every rank there stopped its heartbeat; ending "
            "the step without waiting for Slurm to notice")
        return self.take_out(step, lost, "node_fail")

    def take_out(self, step: StepProcess, nodes: tuple[str, ...], why: str) -> int:
        """End the step without ``nodes`` (``why``: ``node_fail``, lost; ``slow``, found slow
        with a spare to take its place): noted bad, given back to Slurm, the step's
        processes and its srun killed. A failed step's status."""
        self.run.lost = nodes
        self.run.slow = nodes if why == "slow" else ()
        self.bad.note({node: why for node in nodes})
        self.release(nodes)
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

    # ---- once the step ended ---------------------------------------------------------------
    def unexplained(self, status: int, view: JobView | None) -> bool:
        """Did the step fail with nothing said why: no stop signal, no hang, no node found
        lost, and Slurm still calls the run running (a node it has not noticed losing)?"""
        run = self.run
        return status != 0 and not run.caught and run.hang is None and not run.lost and \
            slurm_event(view, self.cfg.restart_count) == "running"

    def wait_for_word(self, status: int, watch: Watch, log: str,
                      view: JobView | None) -> JobView | None:
        """A step that ended: Slurm's newest view. A failure nobody explains
        (:meth:`unexplained`) gets Slurm QUIET_S to speak (a stop signal ends the wait),
        while the nodes where ranks died without a word are asked for a step already (a
        lost node's answer takes a MessageTimeout: the two waits overlap); then a moment
        for the ranks' last words."""
        seen = self.seen
        self._early = None
        if self.unexplained(status, view):
            seen.words_in(watch)
            if not memory_kill(log):
                self._early = self.probe.early(seen.failure(log), watch.records(), log)
            end = self.slurm.monotonic() + QUIET_S
            while self.slurm.monotonic() < end and not self.run.take_signals():
                self.slurm.sleep(POLL_S)
            view = seen.ask(ASK_DEADLINE_S)
        seen.words_in(watch)
        return view

    def at_end(self, status: int, failure: Diagnosis | None, watch: Watch, log: str,
               view: JobView | None) -> EndNodes:
        """What a step's end found of its nodes (``failure``: its first failure): the
        nodes asked (:meth:`wait_for_word` asked them already) that did not answer are
        lost, those that answered faulty; those that froze in a hang or that Slurm calls
        unhealthy are noted bad. The nodes found lost while it ran are taken into it."""
        run, bad = self.run, self.bad
        run.unanswered, run.faulty = (), ()
        if not status:
            run.lost = run.slow = ()
            return EndNodes()
        if not (memory_kill(log) or run.caught or run.hang or run.lost):
            run.unanswered, run.faulty = self.probe.judge(failure, watch.records(), log,
                                                          self._early)
        frozen = run.hang.frozen_nodes if run.hang is not None else ()
        bad.note({node: "hang" for node in frozen})
        unhealthy = {} if frozen else {**bad.check(view), **self.left_out(run.faulty)}
        if self.cfg.elastic:
            bad.note({n: "node_fail" for n in self.gone(view) if n not in bad.found})
        found = EndNodes(unhealthy, self.lost_nodes(view), run.faulty, run.slow)
        run.lost = run.slow = ()       # taken into the facts: the next attempt starts clean
        return found

    def said_end(self, status: int, watch: Watch) -> None:
        """The job log's line for the step's end: its status, or the nodes found lost;
        with spare nodes and a failure but no node lost, when each node's ranks were last
        heard (a lost node heard too lately shows there)."""
        run = self.run
        say(f"training step exited with status {status}" if not run.lost else
            f"training step ended: node(s) {','.join(run.slow)} taken out for slowness"
            if run.slow else f"training step ended: node(s) {','.join(run.lost)} lost")
        if status and self.cfg.elastic and not run.lost:
            say("the ranks were last heard: "
                f"{last_heard(watch.records(), run.on, self.slurm.time())}")

    def left_out(self, faulty: tuple[str, ...]) -> dict[str, str]:
        """Nodes whose ranks died without a word while they answer: with a spare, left
        out at once; without (and the batch node always: the supervisor and the
        rendezvous are there, no step runs without it), tried once more in place and left
        out (noted bad: a requeue avoids them) the second time. The ones left out now, as
        unhealthy nodes."""
        cfg, run = self.cfg, self.run
        out = {node: "its ranks died without a word of their own" for node in faulty
               if (cfg.elastic and node != cfg.batch_node) or node in run.retried}
        run.retried.update(faulty)
        self.bad.note({node: "node_fault" for node in out})
        return out

    def gone(self, view: JobView | None) -> list[str]:
        """[elastic] The step's nodes no longer the job's, or noted as failed nodes."""
        now = set(self.seen.allocated(view))
        return [n for n in self.run.on if n not in now or self.bad.found.get(n) == "node_fail"]

    def lost_nodes(self, view: JobView | None) -> tuple[str, ...]:
        """The step's nodes lost, once it ended: those that answered no step at its end or
        that Slurm marks down; with spare nodes also those found silent while it ran or no
        longer in the job. A node given back earlier is not the step's: its state says
        nothing of this step."""
        run = self.run
        if not self.cfg.elastic:
            down = [n for n in self.seen.allocated(None) if self.bad.found.get(n) == "node_fail"]
            return tuple(dict.fromkeys((*run.unanswered, *down)))
        return tuple(dict.fromkeys((*run.lost, *run.unanswered, *self.gone(view))))

    def release_left(self) -> None:
        """[elastic] The nodes this run leaves out (lost, or faulty while up: it may go dark
        next) taken from the job before Slurm marks them down and ends the run NODE_FAIL;
        never the batch node (the job's own: never given back)."""
        run = self.run
        left = [n for n in (*run.unanswered, *(n for n in run.faulty
                                               if self.bad.found.get(n) == "node_fault"))
                if n != self.cfg.batch_node]
        if left and self.cfg.elastic:
            self.release(tuple(left))

    def release(self, lost: tuple[str, ...]) -> None:
        """Take ``lost`` from the running job (``scontrol update NodeList``), so that Slurm
        marking them DOWN no longer ends it. When Slurm refuses, the run ends NODE_FAIL and
        Slurm requeues it, as without spares."""
        view = self.seen.ask()
        # (without Slurm's view, the allocation at start: leave out every node lost since)
        keep = [n for n in self.seen.allocated(view) if n not in lost
                and self.bad.found.get(n) not in ("node_fail", "slow")]
        try:
            self.slurm.shrink_job(self.cfg.key, keep)
        except SlurmError as exc:
            say(f"could not take {','.join(lost)} from the job ({exc}): Slurm will end this "
                "run NODE_FAIL and requeue it when it marks the node DOWN")
            return
        self.run.given_back.extend(lost)
        say(f"took {','.join(lost)} from the job: it keeps {','.join(keep)}")

    def _kill(self, steps: list[str]) -> None:
        for step_id in steps:
            try:
                self.slurm.signal_steps(step_id, "KILL")
            except SlurmError:
                pass   # the lost node's part: Slurm ends it when it marks the node DOWN


def others_silent(watch: Watch, nodes: list[str], batch_node: str) -> tuple[str, ...]:
    """The step's nodes every one of whose ranks went silent, but the batch node: this
    supervisor runs there, so the node is up, and its ranks' silence is a hang (the
    watchdog's), never a lost node to take from the job (a step without the batch node has
    no rendezvous: an adversarial run's SIGSTOPped ranks on it ended a job as a crash)."""
    return tuple(n for n in watch.silent(nodes) if n != batch_node)
