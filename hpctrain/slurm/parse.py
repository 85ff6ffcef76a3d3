"""Parsers for SLURM's output formats, one function per format.

- ``scontrol show <entity> --oneliner``: one record per line of ``Key=Value`` pairs.
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
