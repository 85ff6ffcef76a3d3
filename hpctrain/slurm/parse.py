"""Parsers for SLURM's output formats, one function per format.

- ``scontrol show <entity> --oneliner``: one record per line of ``Key=Value`` pairs.
- ``sacct --parsable2`` (with header), ``squeue -o SQUEUE_FORMAT``, ``sbatch --parsable``,
  ``scontrol show config``, and Slurm durations.
"""

from __future__ import annotations

import re

# Keys are CamelCase words (sometimes with a colon or slash, e.g. "CfgTRES", "OS");
# a value runs until the next " Key=" so values containing spaces survive.
_KV = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_kv_line(line: str) -> dict[str, str]:
    """Parse one ``scontrol show ... --oneliner`` line into a dict."""
    matches = list(_KV.finditer(line))
    record: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        record[m.group(1)] = line[m.end():end].strip()
    return record


def parse_kv_records(text: str) -> list[dict[str, str]]:
    """Parse ``scontrol show <entity> --oneliner`` output: one dict per non-empty line."""
    return [parse_kv_line(line) for line in text.splitlines()
            if line.strip() and "=" in line]


# --- sacct / squeue (submission and status) -------------------------------------------

def parse_sacct_parsable2(text: str) -> list[dict[str, str]]:
    """Parse ``sacct --parsable2`` output WITH its header line (no ``-n``).

    The header names the fields, so callers never depend on column positions. The last
    field may contain ``|`` (a job name): it keeps the rest of the line. Lines that are
    not records (blank) are skipped.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    names = lines[0].split("|")
    rows = []
    for line in lines[1:]:
        values = line.split("|", len(names) - 1)
        values += [""] * (len(names) - len(values))
        rows.append({n: v.strip() for n, v in zip(names, values)})
    return rows


# `squeue --noheader --array --format` with these fields; the job name is last because
# it is the only one that may contain the separator.
SQUEUE_FIELDS = ("JobIDRaw", "JobID", "State", "Elapsed", "AllocNodes", "NodeList",
                 "Reason", "JobName")
SQUEUE_FORMAT = "%A|%i|%T|%M|%D|%N|%r|%j"


def resized(row: dict[str, str], following: dict[str, str] | None) -> bool:
    """Is this ``sacct -X -D`` row (of one job, oldest first) a resize, not the end of a
    run? A node taken from a running job ([elastic] spare nodes) closes a RESIZING row, and
    the next row starts when it ended. A RESIZING row the job's requeue closed has its next
    row start later (seen on the devcluster: sacct writes no REQUEUED row then)."""
    return (row.get("State", "").split()[:1] == ["RESIZING"] and following is not None
            and following.get("Start") == row.get("End"))


def run_ends(rows: list[dict[str, str]]) -> list[str]:
    """How each run of one job ended, oldest first (``PREEMPTED``, ``NODE_FAIL``, ...; the
    newest run's state while it goes on), from its ``sacct -X -D`` rows (``State``,
    ``Start``, ``End``). A resize is not a run (:func:`resized`: a node taken from the
    running job closes a RESIZING row). A RESIZING row the job's requeue closed stays
    RESIZING: sacct then says nothing of why the run ended."""
    return [(row.get("State", "").split() or [""])[0]
            for row, following in zip(rows, [*rows[1:], None]) if not resized(row, following)]


def parse_squeue(text: str) -> list[dict[str, str]]:
    """Parse ``squeue -h -r -o SQUEUE_FORMAT`` output into dicts keyed like sacct's fields.

    squeue prints elapsed time as ``M:SS`` or ``H:MM:SS`` or ``D-HH:MM:SS``; it is kept
    as printed (see :func:`parse_elapsed`).
    """
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|", len(SQUEUE_FIELDS) - 1)
        if len(values) != len(SQUEUE_FIELDS):
            continue
        rows.append({n: v.strip() for n, v in zip(SQUEUE_FIELDS, values)})
    return rows


def parse_elapsed(text: str) -> int | None:
    """Slurm durations (``[D-]HH:MM:SS``, ``MM:SS``, ``M:SS``, ``INVALID``) -> seconds."""
    text = text.strip()
    if not text or not text[0].isdigit():
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [int(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts[-3:]
    return ((days * 24 + h) * 60 + m) * 60 + s


def parse_sbatch_parsable(text: str) -> str:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``: return the job id."""
    first = text.strip().splitlines()[-1] if text.strip() else ""
    job_id = first.split(";")[0].strip()
    if not job_id.isdigit():
        raise ValueError(f"sbatch --parsable printed {text.strip()!r}, not a job id")
    return job_id


def parse_scontrol_config(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Key = Value`` lines -> dict (other lines ignored)."""
    config = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            config[key.strip()] = value.strip()
    return config


def sbatch_header(script: str) -> list[str]:
    """The lines sbatch reads directives from: up to the first command line.

    sbatch stops looking for ``#SBATCH`` at the first line that is neither blank nor a
    comment, so everything after it is the script body.
    """
    header = []
    for line in script.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        header.append(line)
    return header


def parse_sbatch_directives(script: str) -> dict[str, str]:
    """``#SBATCH --key=value`` / ``#SBATCH --flag`` lines of a script's header -> dict.

    Values are unquoted the way bash would not (sbatch reads them literally, except
    for one level of surrounding quotes, which is removed here too).
    """
    directives: dict[str, str] = {}
    for line in sbatch_header(script):
        text = line.strip()
        if not text.startswith("#SBATCH"):
            continue
        option = text[len("#SBATCH"):].strip().split(" #")[0].strip()
        if not option.startswith("-"):
            continue
        key, sep, value = option.partition("=")
        if not sep and " " in option:
            key, _, value = option.partition(" ")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        directives[key.lstrip("-")] = value
    return directives
