"""Read a JSON-lines log that a job may still be appending to."""

from __future__ import annotations

import json
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    """The complete lines of ``path`` as JSON records, oldest first ([] if it is missing).

    A line without its newline yet is left for the next read: the writer (a rank of a
    running job) may be in the middle of it. Seen in a full run: a 60-byte line that
    crossed a page boundary was read half-written ("Expecting ',' delimiter: line 1
    column 38"), since a write is not atomic against a concurrent read. A complete line
    that is not JSON still fails the test: that is a real defect."""
    if not path.exists():
        return []
    text = path.read_text()
    complete = text[:text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]
