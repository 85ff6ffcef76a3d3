"""The supervisor's typed requests to the ranks (hpctrain.protocol.dialog): what is written
is what is matched, and a word addressed to another attempt or run is never taken."""

from __future__ import annotations

import pytest

from hpctrain import protocol as p
from hpctrain.protocol.dialog import Attempt, Interrupt, Resume, StackRequest, new_seq

HERE = Attempt("run-a", 1, 2)


def as_read(record: dict[str, str], tmp_path) -> dict[str, str]:  # noqa: ANN001
    """Through the file format the relay and the state directory use."""
    p.write_record(tmp_path / "r", record)
    return p.read_record(tmp_path / "r")


def test_a_request_round_trips_through_the_record_format(tmp_path) -> None:  # noqa: ANN001
    assert Resume.read(as_read(Resume(HERE, "go").record(), tmp_path), HERE) == \
        Resume(HERE, "go")
    assert Resume.read(as_read(Resume(HERE, "stop").record(), tmp_path), HERE).action == "stop"
    assert (StackRequest.name, Interrupt.name, Resume.name) == (p.DUMP, p.INTERRUPT, p.RESUME)


@pytest.mark.parametrize("other", [Attempt("run-a", 1, 3), Attempt("run-a", 0, 2),
                                   Attempt("run-b", 1, 2)],
                         ids=["next attempt", "earlier run", "another submission"])
def test_a_word_for_another_attempt_is_not_taken(other: Attempt) -> None:
    assert Resume.read(Resume(other, "go").record(), HERE) is None
    assert new_seq(Interrupt(other, "5.0").record(), HERE, "") == ""


def test_each_request_is_answered_once_per_seq() -> None:
    record = Interrupt(HERE, "5.0").record()
    assert new_seq(record, HERE, "") == "5.0"
    assert new_seq(record, HERE, "5.0") == ""          # answered already
    assert new_seq({**record, "seq": ""}, HERE, "") == ""


def test_only_go_and_stop_are_words() -> None:
    with pytest.raises(ValueError, match="resume action 'maybe'"):
        Resume(HERE, "maybe")
    assert Resume.read({**HERE.fields(), "action": "maybe"}, HERE) is None
