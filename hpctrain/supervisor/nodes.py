"""The allocation's nodes, as the supervisor learns about them: which are bad (Slurm calls
them unhealthy, the partition's health check failed on them, their ranks froze in a hang,
or they answered no step when asked), and keeping a requeued job off them
(``ExcNodeList``). The rules are :mod:`hpctrain.supervisor.decision.running`'s; this
module asks Slurm and acts. A lost node is :mod:`hpctrain.supervisor.nodeloss`'s.
"""

from __future__ import annotations

import sys

from hpctrain import hostlist
from hpctrain.errors import SlurmError
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.decision import exclusion, unhealthy, why_bad
from hpctrain.supervisor.diagnosis import srun_failures
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.recorder import Recorder
from hpctrain.supervisor.scheduler import Scheduler

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
        # node -> why: nodes this run keeps using (a slow one it cannot replace, the batch
        # node) that a requeue leaves out
        self.later: dict[str, str] = {}

    def note(self, nodes: dict[str, str]) -> None:
        """Note ``nodes`` ({node: why}) as bad; the first reason found for a node stays."""
        for node, why in nodes.items():
            self.found.setdefault(node, why)

    def note_later(self, nodes: dict[str, str]) -> None:
        """Note ``nodes`` ({node: why}) for a requeue to leave out, while this run goes on
        with them (not bad for its placement)."""
        for node, why in nodes.items():
            self.later.setdefault(node, why)

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
        found = {**self.later, **self.found}
        if not found or not self.enabled or view is None:
            return {}
        excluded = set(hostlist.expand(view.excluded)) if view.excluded else set()
        try:
            partition = set(self.slurm.partition_nodes(view.partition))
        except SlurmError as exc:
            say(f"could not ask Slurm whether {','.join(found)} can be left out: {exc}")
            return {}
        nodes, why_not = exclusion(found, excluded, view.partition, partition,
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
