"""Progress records for unit tests: what a rank would send, as the supervisor's board
parses it (:class:`hpctrain.protocol.progress.Progress`)."""

from __future__ import annotations

from collections.abc import Mapping

from hpctrain.protocol.progress import Progress


def by_rank(records: Mapping[int, Mapping[str, object]]) -> dict[int, Progress]:
    """``records`` (rank -> the fields a test cares about) parsed as the board parses
    them; the rank, and clocks of 0 where a test gives none, are filled in."""
    out = {}
    for rank, fields in records.items():
        parsed = Progress.parse({"rank": rank, "changed_at": 0, "beat_at": 0, **fields})
        assert parsed is not None, f"not a progress record: {fields}"
        out[rank] = parsed
    return out
