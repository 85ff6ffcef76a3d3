"""The allocation's nodes, as the supervisor judges them: which are bad (Slurm calls them
unhealthy, or their ranks froze in a hang), whether the step may be restarted in place,
and keeping a requeued job off its bad nodes (``ExcNodeList``) when the partition has
room without them.
"""

from __future__ import annotations

import sys
import time

from hpctrain import hostlist
from hpctrain.errors import SlurmError
from hpctrain.protocol.ledger import line
from hpctrain.slurm import control
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.diagnosis import srun_failures
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.watchdog import Hang

MIN_LEFT_S = 30.0            # an in-place restart needs this much beyond the warning's lead
UNHEALTHY = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER")



def unhealthy(state: str) -> bool:
    """Is a node in this Slurm state (``sinfo %T``) unfit to run on? ``*``: not responding."""
    return state.endswith("*") or any(word in state for word in UNHEALTHY)


class BadNodes:
    """The bad nodes of one run of a job, noted as they become known."""

    def __init__(self, key: str, nodelist: str, enabled: bool, needed: int) -> None:
        self.key, self.nodelist, self.enabled = key, nodelist, enabled
        # how many nodes the job needs: from the run's start, never from Slurm's view of a
        # run that lost a node (a completing job's NumNodes drops to the nodes it kept)
        self.needed = needed
        self.found: dict[str, str] = {}    # node -> why (node_fail, hang, drain, ...)

    def check(self, view: JobView | None) -> dict[str, str]:
        """This run's nodes Slurm calls unhealthy ({node: state}); noted as bad."""
        nodelist = self.nodelist or (view.node_list if view else "")
        try:
            states = control.node_states(hostlist.expand(nodelist))
        except SlurmError as exc:
            say(f"could not ask Slurm about the nodes {nodelist}: {exc}")
            return {}
        bad = {n: s for n, s in states.items() if unhealthy(s)}
        for node, state in bad.items():
            down = "DOWN" in state or state.endswith("*")
            self.found.setdefault(node, "node_fail" if down else state.lower())
        return bad

    def run_check(self, argv: tuple[str, ...], nodes: int, timeout_s: int) -> dict[str, str]:
        """Run the partition's health check once on every node of the allocation; the
        nodes where it failed ({node: what srun said}), noted as bad. A check that cannot
        be run or does not finish in time fails no node: the step runs as it would without
        one (never worse off than without the check)."""
        say(f"health check on {nodes} node(s): {' '.join(argv)}")
        try:
            out = control.run_on_nodes(list(argv), nodes, timeout=timeout_s)
        except SlurmError as exc:
            say(f"the health check did not complete ({exc}): running the step anyway")
            return {}
        failed = {f["node"]: f["what"].strip() for f in srun_failures(out)}
        if failed:
            print(out.rstrip(), file=sys.stderr, flush=True)   # the check's own words
        for node in failed:
            self.found.setdefault(node, "health_check")
        return failed

    def obstacle(self, view: JobView | None, hang: Hang | None, lead_s: int) -> str:
        """What forbids restarting the step in this allocation ('' when nothing does): ranks
        that stopped answering, a node Slurm calls unhealthy, too little time left."""
        if hang is not None and hang.frozen_nodes:
            for node in hang.frozen_nodes:
                self.found.setdefault(node, "hang")
            return f"rank(s) on {','.join(hang.frozen_nodes)} stopped answering"
        bad = self.check(view)
        if bad:
            return "node(s) " + ", ".join(f"{n} {s}" for n, s in bad.items())
        if view is not None and view.end_time is not None:
            left = view.end_time - time.time()
            if left < lead_s + MIN_LEFT_S:
                return f"only {max(left, 0):.0f} s of the allocation left"
        return ""

    def to_exclude(self, view: JobView | None) -> dict[str, str]:
        """The bad nodes to add to the job's ExcNodeList ({node: why}); {} when there are
        none, exclusion is off, or the partition would keep too few nodes without them
        (then it says so: a job that can never run again is worse than a bad node)."""
        if not self.found or not self.enabled or view is None:
            return {}
        try:
            excluded = set(hostlist.expand(view.excluded)) if view.excluded else set()
            nodes = {n: why for n, why in self.found.items() if n not in excluded}
            room = set(control.partition_nodes(view.partition)) - excluded - set(nodes)
        except SlurmError as exc:
            say(f"could not ask Slurm whether {','.join(self.found)} can be left out: {exc}")
            return {}
        needed = max(self.needed, view.num_nodes, 1)
        if nodes and len(room) < needed:
            say(f"not excluding {','.join(nodes)}: partition {view.partition} would keep "
                f"{len(room)} node(s), the job needs {needed}")
            return {}
        return nodes

    def exclude(self, state: StateDir, view: JobView, nodes: dict[str, str],
                restart_count: int) -> bool:
        """Add ``nodes`` to the (requeued, pending) job's ExcNodeList; ledger lines."""
        old = hostlist.expand(view.excluded) if view.excluded else []
        try:
            control.set_excluded(self.key, sorted(set(old) | set(nodes)))
        except SlurmError as exc:
            say(f"could not exclude {','.join(nodes)}: {exc}")
            return False
        for node, why in nodes.items():
            say(f"job {self.key} will not run on {node} again ({why})")
            state.append_ledger(line("exclude", node=node, cause=why,
                                     restart_count=restart_count))
        return True
