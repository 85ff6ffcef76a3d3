"""The save plan's exchanges (collective), each rank's side and rank 0's: the plan agreed
on or made (:func:`provisional`), and the values compared at every save (:func:`settle`).

Each is a fixed sequence of :class:`~hpctrain.checkpoint.comm.Comm`'s byte collectives, so
that no rank receives more than O(1) bytes but the coordinator: an all-reduce of three
numbers; when a plan is made, a gather of the structures to rank 0 and a scatter of each
rank's part; at every save a gather of the fingerprints and a scatter of the answers.
Rank 0's part never raises (:mod:`hpctrain.checkpoint.coordinator`): what fails there
reaches every rank as its answer, so none is left waiting in a collective.
"""

from __future__ import annotations

from typing import Any

from hpctrain.checkpoint import coordinator
from hpctrain.checkpoint.saveplan import PlanCache, RankPlan, Structure, fingerprint_message
from hpctrain.errors import CheckpointError


def provisional(comm: Any, cache: PlanCache, structure: Structure) -> RankPlan:
    """This rank's part of the plan (collective): the cached one when every rank's
    structure is unchanged, else a new one from the coordinator. PlanFailed on every
    rank when the coordinator fails; CheckpointError when the exchange itself does."""
    with _exchange("agreeing on the save plan"):
        votes = comm.all_reduce_max(cache.vote(structure))
    kept = cache.reused(votes)
    if kept is not None:
        return kept
    with _exchange("making the save plan"):
        gathered = comm.gather_bytes(structure.contribution())
        parts, made = coordinator.plan(gathered) if gathered is not None else (None, None)
        part = comm.scatter_bytes(parts)
    return cache.adopt(structure, part, made)


def settle(comm: Any, cache: PlanCache, plan: RankPlan, structure: Structure,
           prints: list[int] | None) -> tuple[RankPlan, list[tuple]] | None:
    """Compare this save's fingerprints (collective; ``prints`` None: this rank failed):
    the final plan and the extras that differ by rank, or None when a rank failed."""
    with _exchange("comparing the fingerprints"):
        gathered = comm.gather_bytes(fingerprint_message(prints, plan.message), plan.message)
        answers = None if gathered is None else coordinator.settle(cache.coordinator,
                                                                    gathered)
        answer = comm.scatter_bytes(answers)
    return cache.settled(plan, answer, structure)


class _exchange:
    """A collective of the plan that fails (a rank died, the group timed out) raises a
    CheckpointError that says where, instead of the backend's own error."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and isinstance(exc, RuntimeError):
            raise CheckpointError(
                f"the save failed while {self.what}: {exc} (another rank left the save: "
                "see its log; nothing of this step was committed)") from None
        return False
