"""The supervisor's requests to the ranks of a running step, typed: what the supervisor
stands on its board (:mod:`hpctrain.supervisor.board`, pushed to every node's relay) and
what each rank matches, in one place. The clocks of the dialog are in
:mod:`hpctrain.protocol.timeouts`.

Every request is addressed to one attempt of one run of one job (:class:`Attempt`); a rank
acts on it only when the address is its own (:meth:`Attempt.matches`, the one match
rule), so a word left from an earlier attempt or run is never taken for a new one:

- :class:`StackRequest` (``dump``): write your stacks (the watchdog names a hang's culprits);
- :class:`Interrupt` (``interrupt``): leave this attempt, wherever you wait;
- :class:`Resume` (``resume``): ``go`` (start the next attempt in this process) or
  ``stop`` (let the exception go on: the process ends).

Records are flat ``key=value`` maps (:func:`hpctrain.protocol.read_record`), parsed once per
look by the reader. The ranks' own progress records are typed in
:mod:`hpctrain.protocol.progress`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.protocol import DUMP, INTERRUPT, RESUME  # the records' names

ACTIONS = ("go", "stop")


def text(record: Mapping[str, object], key: str) -> str:
    """Field ``key`` of a record as text ('' when absent): read from a file it is already
    text, from a datagram's JSON it may be a number. Only the fields asked for are
    converted (the board parses every rank's record as it arrives)."""
    value = record.get(key)
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Attempt:
    """The address of a request: attempt ``attempt`` of run ``restart_count`` of job run
    ``run_id`` (the submission's id, as in every record)."""

    run_id: str
    restart_count: int
    attempt: int

    def fields(self) -> dict[str, str]:
        return {"run_id": self.run_id, "restart_count": str(self.restart_count),
                "attempt": str(self.attempt)}

    @classmethod
    def parse(cls, record: Mapping[str, object]) -> Attempt | None:
        """The address ``record`` carries (a request's, or a progress record's); None when
        its counts are not numbers."""
        try:
            return cls(text(record, "run_id"), int(text(record, "restart_count") or 0),
                       int(text(record, "attempt") or 0))
        except ValueError:
            return None

    def matches(self, record: Mapping[str, object]) -> bool:
        """Is ``record`` addressed to this attempt? The one rule every reader uses (typed
        records compare their :attr:`~hpctrain.protocol.progress.Progress.address`)."""
        return Attempt.parse(record) == self


@dataclass(frozen=True)
class _Once:
    """A request answered once per ``seq`` by every rank of attempt ``to``."""

    to: Attempt
    seq: str

    def record(self) -> dict[str, str]:
        return {**self.to.fields(), "seq": self.seq}


class StackRequest(_Once):
    """Write your stacks (the watchdog names a hang's culprits)."""

    name = DUMP


class Interrupt(_Once):
    """Leave the attempt (its process groups aborted, then ``Interrupted`` raised in the
    main thread)."""

    name = INTERRUPT


@dataclass(frozen=True)
class Resume:
    """The word on attempt ``to`` (the *next* attempt): ``go`` or ``stop``."""

    to: Attempt
    action: str
    name = RESUME

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"resume action {self.action!r}: one of {ACTIONS}")

    def record(self) -> dict[str, str]:
        return {**self.to.fields(), "action": self.action}

    @classmethod
    def read(cls, record: Mapping[str, str], to: Attempt) -> Resume | None:
        """The word in ``record`` when it is addressed to ``to`` (else None: not yet)."""
        if not to.matches(record) or record.get("action") not in ACTIONS:
            return None
        return cls(to, record["action"])


def new_seq(record: Mapping[str, str], to: Attempt, answered: str) -> str:
    """The ``seq`` of a request addressed to ``to`` that was not answered yet, else ''."""
    seq = record.get("seq", "")
    return seq if seq and seq != answered and to.matches(record) else ""
