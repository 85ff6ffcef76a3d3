"""A lost node, told from a crash however it dies (pure; the supervisor asks the node,
:mod:`hpctrain.supervisor.gather`).

A node can die in several orders. Gone dark first (its slurmd, then its processes unseen),
its ranks go silent while the others beat on, and :func:`hpctrain.supervisor.elastic.
silent_nodes` finds it. But when its processes die first (a GPU fallen off the bus; the
devcluster's kill -9) their slurmstepd reports it ("srun: error: n2: task 1: Killed") and
srun ends the step at once, before anyone is silent for long; a power loss closes their
connections too. Either way the survivors' only evidence is a lost peer ("Connection closed
by peer"), and the first failure the launcher names is one of those consequences.

Such a failure is not called a crash until the node where ranks died without a word has
been asked for its own (:func:`suspect_nodes` names those nodes; the supervisor then launches a
step there through its slurmd: a node that answers is alive, and the failure a crash of
its own; one that does not is lost). A failure some rank raised of its own (an exception
that is not a lost peer, Slurm's memory kill) is a crash, and asks nothing: its own
rank's word already says where it failed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from hpctrain.protocol.progress import Progress
from hpctrain.supervisor.diagnosis import Diagnosis, is_peer_lost

# srun's word for a task that died of a signal nobody in the step sent: its stepd saw it
_KILLED = re.compile(r"^srun: error: (?P<node>\S+): tasks? [\d,\-]+: Killed$")
# what the ranks say when only their peers failed (hpctrain.runtime's ``failed`` word)
CONSEQUENCES = ("peer", "timeout", "interrupted")


def own_failure(failure: Diagnosis | None, records: Mapping[int, Progress]) -> bool:
    """Did some rank fail of its own: an error that is not a lost peer (the launcher's or the
    runtime's first failure), or a rank's own word that its attempt crashed?"""
    if any(r.failed and r.failed not in CONSEQUENCES for r in records.values()):
        return True
    return failure is not None and failure.error is not None and \
        not is_peer_lost(failure.error)


def killed_nodes(segment: str) -> list[str]:
    """The nodes srun says tasks were killed on (``srun: error: n2: task 1: Killed``)."""
    return [m["node"] for line in segment.splitlines()
            if (m := _KILLED.match(line.strip()))]


def wordless_nodes(records: Mapping[int, Progress], nodes: Sequence[str]) -> list[str]:
    """The step's ``nodes`` none of whose ranks said a last word (exiting, exited, waiting to
    restart) while a rank elsewhere did: their processes died without one."""
    by_node: dict[str, list[Progress]] = {}
    for rec in records.values():
        by_node.setdefault(rec.node, []).append(rec)
    quiet = [n for n in nodes if by_node.get(n) and not any(r.final for r in by_node[n])]
    spoke = any(r.final for n, recs in by_node.items() if n not in quiet for r in recs)
    return quiet if spoke else []


def suspect_nodes(failure: Diagnosis | None, records: Mapping[int, Progress], segment: str,
             nodes: Sequence[str]) -> tuple[str, ...]:
    """The nodes to ask before a failed step is called a crash: where ranks died without a
    word (srun saw their tasks killed, or none of their ranks said a last word), when no
    rank failed of its own. Empty: the failure is what it says."""
    if own_failure(failure, records):
        return ()
    found = [*wordless_nodes(records, nodes), *killed_nodes(segment)]
    if failure is not None and failure.node and failure.signal == "SIGKILL":
        found.append(failure.node)
    return tuple(dict.fromkeys(n for n in found if n))
