"""The supervisor's lines in the job log: stderr of the batch step, marked as its own."""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """One line for the job log: ``hpctrain: <message>``."""
    print(f"hpctrain: {message}", file=sys.stderr, flush=True)
