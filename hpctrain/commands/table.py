"""The one table formatter of the CLI: columns padded to their widest cell, long cells cut.

    print(table(["JOBID", "STATE"], [["12", "RUNNING"]]))
    print(table(["rank", "node"], rows, right={0, 1}))      # numbers right-aligned
"""

from __future__ import annotations

from typing import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[object]], *,
          right: Iterable[int] = (), max_width: int = 48, gap: str = "  ") -> str:
    """``header`` and ``rows`` as aligned text lines; columns in ``right`` are right-aligned,
    cells longer than ``max_width`` are cut there; trailing blanks are dropped."""
    cells = [[str(c)[:max_width] for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    right = set(right)
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(gap.join(parts).rstrip())
    return "\n".join(lines)
