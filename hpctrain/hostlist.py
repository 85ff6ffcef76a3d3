"""Slurm host lists (``SLURM_JOB_NODELIST``): the one parser, pure, importable anywhere.

Slurm writes ``n[1-3,7],gpu[01-02]-ib[0-1],login``: comma-separated expressions, each a
text with bracketed ranges; several bracket groups multiply (``a[1-2]b[3-4]`` is
``a1b3 a1b4 a2b3 a2b4``, the last group fastest) and a range keeps the zero padding of
its lower bound (``n[09-11]`` is ``n09 n10 n11``). This is what ``scontrol show
hostnames`` prints; tests/cluster/test_hostlist_cluster.py holds the two side by side.
One difference, on purpose: text after the last bracket (``n[1-2]-ib``), which Slurm
22.05 refuses and newer releases accept, is kept as a suffix here.
"""

from __future__ import annotations

import itertools
import re

from hpctrain.errors import HostlistError

_GROUP = re.compile(r"\[([^\[\]]*)\]")

def expand(nodelist: str) -> list[str]:
    """Every host of ``nodelist`` in Slurm's order (duplicates kept, as Slurm keeps them)."""
    hosts: list[str] = []
    for expr in _split_top(nodelist.strip()):
        hosts += _expand_one(expr)
    return hosts


def first(nodelist: str, default: str = "127.0.0.1") -> str:
    """The first host of ``nodelist`` (the rendezvous host), ``default`` when it is empty."""
    exprs = _split_top(nodelist.strip())
    if not exprs:
        return default
    # the first value of each bracket group; no full expansion of a 1000-node list
    return _GROUP.sub(lambda m: _ranges(m.group(1), nodelist)[0], exprs[0])


def _split_top(nodelist: str) -> list[str]:
    """Split at the commas that are not inside brackets; empty parts dropped."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(nodelist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(nodelist[start:i])
            start = i + 1
    if depth != 0:
        raise HostlistError(f"host list {nodelist!r} has an unclosed '['")
    parts.append(nodelist[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(expr: str) -> list[str]:
    texts = _GROUP.split(expr)  # text, ranges, text, ranges, ..., text
    literals, groups = texts[0::2], [_ranges(r, expr) for r in texts[1::2]]
    if any("[" in t or "]" in t for t in literals):
        raise HostlistError(f"host list {expr!r} has nested or stray brackets")
    out = []
    for combo in itertools.product(*groups):
        out.append("".join(lit + val for lit, val in zip(literals, combo)) + literals[-1])
    return out


def _ranges(body: str, where: str) -> list[str]:
    """``1-3,7`` -> ``1 2 3 7``; ``09-11`` keeps the width of ``09``."""
    values = []
    for part in body.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise HostlistError(f"host list {where!r}: {part!r} is not a number or a range")
        low, high = int(lo), int(hi) if dash else int(lo)
        if high < low:
            raise HostlistError(f"host list {where!r}: range {part!r} runs backwards")
        width = len(lo) if lo.startswith("0") else 0
        values += [str(i).zfill(width) for i in range(low, high + 1)]
    return values
