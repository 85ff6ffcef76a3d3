"""How old the step a status showed was: its polls against the job's own step log (the
live-status cluster test, benchmarks/status_lag_bench.py and the rehearsal)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True)
class Poll:
    """One status, as printed: when (wall clock), the step shown, where it came from."""

    at: float
    step: int
    source: str


def staleness(poll: Poll, done_at: Mapping[int, float]) -> float:
    """How long the shown step had been over when the status was printed: 0 while the
    job was still in it, else the time since it logged that step done."""
    done = done_at.get(poll.step)
    return poll.at - done if done is not None and done <= poll.at else 0.0


def ahead(poll: Poll, done_at: Mapping[int, float]) -> bool:
    """Did the status show a step the job had not begun (the step before it not done)?"""
    if poll.step <= min(done_at, default=0):
        return False
    done = done_at.get(poll.step - 1)
    return done is None or done > poll.at


def figures(polls: Iterable[Poll], done_at: Mapping[int, float]) -> dict[str, float]:
    """Median and worst staleness (s) and how many polls."""
    ages = [staleness(p, done_at) for p in polls]
    return {"polls": len(ages), "median_s": statistics.median(ages) if ages else 0.0,
            "worst_s": max(ages, default=0.0)}
