"""The exit record: a few ``key=value`` lines the batch script can read with grep.

Why a file as well as the exit code: launchers (torchrun, deepspeed, mpirun) report
their own exit code when a worker leaves, so the batch script may never see 75/76.
Rank 0 writes ``$HPCTRAIN_EXIT_FILE`` just before leaving for requeue::

    cause=preemption
    exit_code=75
    requeue=1
    step=120
    restart_count=0
    job_id=123

The next run reads it back to learn ``last_exit_cause`` when its restart count is one
more than the record's (else the previous run left without a record: node failure).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def format_record(fields: Mapping[str, object]) -> str:
    lines = []
    for key, value in fields.items():
        text = str(value)
        if "\n" in text or "=" in key:
            raise ValueError(f"exit record field {key!r}={text!r} must be one line")
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


def parse_record(text: str) -> dict[str, str]:
    """Inverse of :func:`format_record`; ignores blank and malformed lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def write_record(path: str | os.PathLike[str], fields: Mapping[str, object]) -> None:
    """Write atomically (tmp + rename), so a kill mid-write leaves the old record or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(format_record(fields))
    os.replace(tmp, path)


def read_record(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """The record at ``path``, or {} when there is none."""
    if not path:
        return {}
    try:
        return parse_record(Path(path).read_text())
    except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
        return {}


def previous_cause(record: Mapping[str, str], restart_count: int) -> str | None:
    """The cause the previous run left with, inferred from its record.

    First run: None. Requeued and the record comes from the run just before: its cause.
    Requeued without such a record: nobody lived to write it, i.e. ``node_fail`` (or a
    kill before the emergency save finished, which recovers the same way). A record that
    did not ask for a requeue (``requeue=0``: the surviving ranks' crash record when a
    node dies under them) yet was followed by one: Slurm requeued it, ``node_fail`` too.
    """
    if restart_count == 0:
        return None
    if (record.get("restart_count") == str(restart_count - 1) and record.get("cause")
            and record.get("requeue") != "0"):
        return record["cause"]
    return "node_fail"
