"""What a load does with what does not fit: a saved tensor the state has no place for
(``unexpected``: not loaded) and a value of the state the step has none for (``missing``:
kept as the state had it).

Both can be right (a pipeline stage loads its own layers, not the other stages'; a new
entry of the state starts from its own value), but a silent one hides a mistake: a
renamed layer trained on from its random init. So a load says them in one line of the job
log by default ("warn"), and either can be refused ("error": CheckpointError, nothing
loaded) or left unsaid ("ignore"). A tensor of the state the step lacks stays an error
whatever the choice (:mod:`hpctrain.checkpoint.loader`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from hpctrain.checkpoint.tree import has_room
from hpctrain.errors import CheckpointError

CHOICES = ("warn", "error", "ignore")
SHOWN = 6                      # names a line or an error gives before "and N more"
Path_ = tuple


@dataclass(frozen=True)
class Fit:
    """The caller's choice for each kind of misfit (``load``'s ``on_unexpected`` and
    ``on_missing``)."""

    unexpected: str = "warn"
    missing: str = "warn"

    def __post_init__(self) -> None:
        for name, value in (("on_unexpected", self.unexpected), ("on_missing", self.missing)):
            if value not in CHOICES:
                raise CheckpointError(f"{name}={value!r}: use \"warn\" (say it in the job "
                                      "log), \"error\" (refuse the load) or \"ignore\"")


@dataclass
class Misfit:
    """What of step ``step`` did not fit this rank's state, and who is told."""

    step: int
    fit: Fit
    unexpected: list[Path_] = field(default_factory=list)
    missing: list[Path_] = field(default_factory=list)

    def refuse_unexpected(self) -> None:
        """CheckpointError when the caller refuses saved tensors left out (nothing is
        loaded yet: called before the first read)."""
        if self.unexpected and self.fit.unexpected == "error":
            raise CheckpointError(
                f"step {self.step} holds {_count(self.unexpected, 'tensor')} the state has no "
                f"place for: {names(self.unexpected)}; nothing was loaded. Build the state "
                "with these keys (the model as it was saved), or load with "
                "on_unexpected=\"warn\" to load the rest without them")

    def refuse_missing(self) -> None:
        """CheckpointError when the caller refuses state values the step leaves as they
        were (called before any tensor of the state is written)."""
        if self.missing and self.fit.missing == "error":
            raise CheckpointError(
                f"step {self.step} has no value for {_count(self.missing, 'entry', 'entries')}"
                f" of the state: {names(self.missing)}; nothing was loaded. Leave them out "
                "of the state you load (set them afterwards), load a step saved with them, "
                "or load with on_missing=\"warn\" to keep the state's own values")

    def refusal(self) -> str | None:
        """The CheckpointError's message when the caller refuses this misfit (either
        kind), else None: for a restore from memory, whose ranks agree before any writes."""
        try:
            self.refuse_unexpected()
            self.refuse_missing()
        except CheckpointError as exc:
            return str(exc)
        return None

    def line(self, rank: int | None = None) -> str:
        """The job log's line ('' when there is nothing to say); ``rank``: whose state
        (under torch.distributed: the other ranks' may differ, a pipeline's do)."""
        parts = []
        if self.unexpected and self.fit.unexpected == "warn":
            parts.append(f"not loaded, no place in the state: {names(self.unexpected)}")
        if self.missing and self.fit.missing == "warn":
            parts.append(f"not in the step, kept as the state had it: {names(self.missing)}")
        if not parts:
            return ""
        whose = "" if rank is None else f" (rank {rank}'s state)"
        return (f"checkpoint step {self.step}{whose}: {'; '.join(parts)} "
                "(load's on_unexpected=/on_missing=\"error\" refuses such a load, "
                "\"ignore\" quiets this line)")


def in_memory(step: int, fit: Fit | None, state: dict, tensors: Iterable[Path_],
              extras: Iterable[Path_]) -> Misfit:
    """What of step ``step``, restored from memory (a snapshot, a peer copy), does not fit
    ``state`` (nothing written yet), by the rules of a load from storage: of its
    ``tensors``, those ``state`` has no place for (:func:`unplaced`; the restore leaves
    them out), and the values of ``state`` neither they nor its ``extras`` set."""
    tensors = list(tensors)
    return Misfit(step, fit or Fit(), unplaced(state, tensors),
                  unfilled(state, [*tensors, *extras]))


def unplaced(state: dict, saved: Iterable[Path_]) -> list[Path_]:
    """The ``saved`` tensor paths ``state`` has no place for (a key missing inside a part
    it holds: :func:`~hpctrain.checkpoint.tree.has_room`); they are not loaded."""
    return sorted((p for p in saved if not has_room(state, p)), key=repr)


def unfilled(state: dict, saved: Iterable[Path_]) -> list[Path_]:
    """The paths of ``state``'s values that are no tensor which no ``saved`` path (tensor
    or extra) sets, at them, inside them or above them; they keep the state's value."""
    values = list(_values(state, ()))
    if not values:
        return []
    at = set(saved)
    under = {p[:i] for p in at for i in range(1, len(p) + 1)}   # set at or beneath
    return [p for p in values
            if p not in under and not any(p[:i] in at for i in range(1, len(p)))]


def _values(node: dict, prefix: Path_) -> Iterator[Path_]:
    """The paths of ``node``'s leaves that are no tensor, walked as ``tree.flatten`` does
    (a non-empty dict is descended into; an empty one is a leaf)."""
    for key, value in node.items():
        path = prefix + (key,)
        if isinstance(value, dict) and value:
            yield from _values(value, path)
        elif not isinstance(value, torch.Tensor):
            yield path


def names(paths: list[Path_]) -> str:
    """``model.head.weight, optim.state.3.exp_avg and 12 more``."""
    shown = ", ".join(".".join(map(str, p)) for p in paths[:SHOWN])
    return shown + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


def _count(paths: list, one: str, many: str | None = None) -> str:
    return f"{len(paths)} {one if len(paths) == 1 else (many or one + 's')}"
