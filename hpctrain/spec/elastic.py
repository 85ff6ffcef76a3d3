"""``[elastic]``: spare nodes a job holds so that a lost node costs a restart inside the
allocation, not a requeue, and how far it may shrink when none is left
(docs/fault-recovery.md, "A lost node and a spare", "Shrinking without a spare")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.errors import SpecError
from hpctrain.spec.checks import check_table

MAX_SPARES = 64


@dataclass(frozen=True)
class ElasticSpec:
    """``spare_nodes``: nodes the job asks for beyond ``nodes`` and keeps idle; the step
    runs on ``nodes`` of them. When one of the step's nodes is lost, the supervisor starts
    the step again on the others and a spare (same world size, same layout), in the same
    allocation. Spares cost their GPU-hours for the whole job (``plan``, ``report``)."""

    spare_nodes: int = 0
    # the fewest nodes the step may shrink to when a node is lost and no spare is left
    # (whole model-parallel groups, the global batch kept by accumulation); None: never
    # shrink (a lost node without a spare requeues the job)
    min_nodes: int | None = None
    # every rank's newest snapshot (CheckpointManager.snapshot, an async save's staged copy)
    # also kept in its node's memory and a partner's on another node, so that a lost node
    # costs at most the snapshot interval (hpctrain.checkpoint.peers); None: on with spares
    peer_copies: bool | None = None

    def copies(self, nodes: int) -> bool:
        """Are peer copies on for a step on ``nodes`` nodes (a partner needs another)? On
        by default with spares or a shrink: both restore from them."""
        shrinks = self.min_nodes is not None and self.min_nodes < nodes
        wanted = self.spare_nodes > 0 or shrinks if self.peer_copies is None \
            else self.peer_copies
        return wanted and nodes > 1

    @classmethod
    def from_dict(cls, data: Any) -> "ElasticSpec":
        d = check_table(data, "elastic", cls)
        spares = d.get("spare_nodes", 0)
        if isinstance(spares, bool) or not isinstance(spares, int) or \
                not 0 <= spares <= MAX_SPARES:
            raise SpecError(f"elastic.spare_nodes={spares!r} must be a whole number 0.."
                            f"{MAX_SPARES} (nodes held for a lost one; 1 is the usual)")
        copies = d.get("peer_copies")
        if copies is not None and not isinstance(copies, bool):
            raise SpecError(f"elastic.peer_copies={copies!r} must be true or false (snapshots "
                            "also kept in a partner node's memory; on by default with "
                            "spare_nodes)")
        least = d.get("min_nodes")
        if least is not None and (isinstance(least, bool) or not isinstance(least, int)
                                  or least < 1):
            raise SpecError(f"elastic.min_nodes={least!r} must be a whole number >= 1 (the "
                            "fewest nodes the step may shrink to when a node is lost and no "
                            "spare is left; leave it out never to shrink)")
        return cls(spare_nodes=spares, peer_copies=copies, min_nodes=least)
