"""The allocation's nodes, as the supervisor learns about them: which are bad (Slurm calls
them unhealthy, the partition's health check failed on them, their ranks froze in a hang,
or they answered no step when asked), and keeping a requeued job off them
(``ExcNodeList``). The rules are :mod:`hpctrain.supervisor.decision.running`'s and
:mod:`hpctrain.supervisor.lost`'s; this module asks Slurm and the nodes, and acts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from hpctrain import hostlist
from hpctrain.errors import SlurmError
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.decision import exclusion, unhealthy, why_bad
from hpctrain.protocol.progress import Progress
from hpctrain.supervisor.diagnosis import Diagnosis, srun_failures
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.lost import suspect_nodes
from hpctrain.supervisor.recorder import Recorder
from hpctrain.supervisor.scheduler import NodeAnswers, Scheduler

PROBE_S = 30.0               # a node asked for a step (a lost one fails after MessageTimeout)


class BadNodes:
    """The bad nodes of one run of a job, noted as they become known."""

    def __init__(self, slurm: Scheduler, key: str, nodelist: str, enabled: bool,
                 needed: int, found: dict[str, str] | None = None) -> None:
        self.slurm, self.key, self.nodelist, self.enabled = slurm, key, nodelist, enabled
        # how many nodes the job needs: from the run's start, never from Slurm's view of a
        # run that lost a node (a completing job's NumNodes drops to the nodes it kept)
        self.needed = needed
        # node -> why (node_fail, hang, drain, ...): the run state's (RunState.bad)
        self.found: dict[str, str] = {} if found is None else found

    def note(self, nodes: dict[str, str]) -> None:
        """Note ``nodes`` ({node: why}) as bad; the first reason found for a node stays."""
        for node, why in nodes.items():
            self.found.setdefault(node, why)

    def check(self, view: JobView | None) -> dict[str, str]:
        """This run's nodes Slurm calls unhealthy ({node: state}); noted as bad."""
        nodelist = self.nodelist or (view.node_list if view else "")
        try:
            states = self.slurm.node_states(hostlist.expand(nodelist))
        except SlurmError as exc:
            say(f"could not ask Slurm about the nodes {nodelist}: {exc}")
            return {}
        bad = {n: s for n, s in states.items() if unhealthy(s)}
        self.note({n: why_bad(s) for n, s in bad.items()})
        return bad

    def run_check(self, argv: tuple[str, ...], nodes: int, timeout_s: int) -> dict[str, str]:
        """Run the partition's health check once on every node of the allocation; the
        nodes where it failed ({node: what srun said}), noted as bad. A check that cannot
        be run or does not finish in time fails no node: the step runs as it would without
        one (never worse off than without the check)."""
        say(f"health check on {nodes} node(s): {' '.join(argv)}")
        try:
            out = self.slurm.run_on_nodes(list(argv), nodes, timeout_s)
        except SlurmError as exc:
            say(f"the health check did not complete ({exc}): running the step anyway")
            return {}
        failed = {f["node"]: f["what"].strip() for f in srun_failures(out)}
        if failed:
            print(out.rstrip(), file=sys.stderr, flush=True)   # the check's own words
        self.note({node: "health_check" for node in failed})
        return failed

    def to_exclude(self, view: JobView | None) -> dict[str, str]:
        """The bad nodes to add to the job's ExcNodeList ({node: why}); {} when there are
        none, exclusion is off, or the partition would keep too few nodes without them."""
        if not self.found or not self.enabled or view is None:
            return {}
        excluded = set(hostlist.expand(view.excluded)) if view.excluded else set()
        try:
            partition = set(self.slurm.partition_nodes(view.partition))
        except SlurmError as exc:
            say(f"could not ask Slurm whether {','.join(self.found)} can be left out: {exc}")
            return {}
        nodes, why_not = exclusion(self.found, excluded, view.partition, partition,
                                   max(self.needed, view.num_nodes, 1))
        if why_not:
            say(why_not)
        return nodes

    def exclude(self, books: Recorder, view: JobView, nodes: dict[str, str]) -> bool:
        """Add ``nodes`` to the (requeued, pending) job's ExcNodeList; ledger lines."""
        old = hostlist.expand(view.excluded) if view.excluded else []
        try:
            self.slurm.set_excluded(self.key, sorted(set(old) | set(nodes)))
        except SlurmError as exc:
            say(f"could not exclude {','.join(nodes)}: {exc}")
            return False
        for node, why in nodes.items():
            say(f"job {self.key} will not run on {node} again ({why})")
            books.excluded(node, why)
        return True


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
