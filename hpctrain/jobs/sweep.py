"""Sweeps, planned: a grid becomes override sets, and the override sets become job arrays.

Pure (no subprocess, no environment, no files): ``hpctrain sweep`` and
:func:`hpctrain.api.submit_sweep` do the submitting.

- :func:`parse_grid` reads ``--grid key=v1,v2`` options;
- :func:`grid_points` is their cartesian product, in a stable order (first key slowest);
- :func:`plan_arrays` turns N points into ONE ``--array=0-(N-1)%K`` job array, split into
  several arrays (chained so at most K tasks ever run at once) when N exceeds the
  cluster's MaxArraySize;
- :func:`task_checkpoint_dir` gives each point its own checkpoint subdirectory.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

from hpctrain.errors import SpecError

# keys whose value the sweep itself sets per point
RESERVED_KEYS = ("checkpoint.dir",)


def parse_grid(options: Sequence[str]) -> dict[str, list[str]]:
    """``["lr=1e-3,3e-4", "layout.tp=1,2"]`` -> ``{"lr": ["1e-3", "3e-4"], "layout.tp": ["1", "2"]}``.

    Values stay strings: the spec's own ``--set`` parser types them, so a sweep value
    means exactly what the same ``--set key=value`` would.
    """
    grid: dict[str, list[str]] = {}
    for option in options:
        key, sep, values = option.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(f"--grid {option!r}: expected key=v1,v2,... (e.g. --grid layout.tp=1,2)")
        if key in grid:
            raise SpecError(f"--grid {key} given twice: put all its values in one option "
                            f"(--grid {key}={','.join([*grid[key], values])})")
        if key in RESERVED_KEYS:
            raise SpecError(f"--grid {key}: the sweep gives every point its own subdirectory "
                            f"of {key}; set the parent with --set {key}=DIR instead")
        items = [v.strip() for v in values.split(",")]
        if any(not v for v in items):
            raise SpecError(f"--grid {option!r}: empty value in the list; write --grid {key}=v1,v2")
        if len(set(items)) != len(items):
            raise SpecError(f"--grid {option!r}: repeated value; each value must appear once")
        grid[key] = items
    if not grid:
        raise SpecError("a sweep needs at least one --grid key=v1,v2")
    return grid


def grid_points(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """The cartesian product of the grid, first key varying slowest."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def point_label(point: dict[str, str]) -> str:
    """A short human label for one point: ``layout.tp=2,lr=1e-3``."""
    return ",".join(f"{k}={v}" for k, v in point.items())


@dataclass(frozen=True)
class ArrayChunk:
    """One ``sbatch --array`` submission covering points [offset, offset + size)."""

    offset: int
    size: int
    max_parallel: int | None
    # index of the chunk this one must wait for (``--dependency=afterany``), or None
    after: int | None

    @property
    def array_option(self) -> str:
        """The ``--array`` value: ``0-(size-1)`` with ``%K`` when throttled."""
        spec = f"0-{self.size - 1}"
        if self.max_parallel is not None:
            spec += f"%{min(self.max_parallel, self.size)}"
        return spec

    def point_index(self, task_id: int) -> int:
        """The grid point an array task id of this chunk runs."""
        return self.offset + task_id


def plan_arrays(n_points: int, max_parallel: int | None, max_array_size: int) -> list[ArrayChunk]:
    """Split N points into job arrays no larger than the cluster allows.

    Slurm's MaxArraySize bounds the task *index* (indices 0..MaxArraySize-1), so a chunk
    holds at most MaxArraySize tasks. When a sweep is split AND throttled, each chunk
    waits for the previous one (afterany): ``%K`` throttles one array only, so chaining
    is what keeps the whole sweep at no more than K tasks at once.
    """
    if n_points < 1:
        raise SpecError("the grid is empty: give at least one value per --grid key")
    if max_parallel is not None and max_parallel < 1:
        raise SpecError(f"--max-parallel {max_parallel}: must be at least 1")
    if max_array_size < 1:
        raise SpecError(f"MaxArraySize={max_array_size}: the cluster allows no job arrays")
    chunks = []
    for i, offset in enumerate(range(0, n_points, max_array_size)):
        size = min(max_array_size, n_points - offset)
        after = i - 1 if (i > 0 and max_parallel is not None) else None
        chunks.append(ArrayChunk(offset, size, max_parallel, after))
    return chunks


def task_checkpoint_dir(base: str, index: int, width: int) -> str:
    """Checkpoint subdirectory of point ``index``: ``BASE/point-007`` (zero-padded)."""
    return f"{base.rstrip('/')}/point-{index:0{width}d}"


def point_checkpoint_dir(rec: Any, task: int) -> str:
    """The checkpoint dir of task ``task`` of the sweep array recorded in ``rec`` (a
    :class:`hpctrain.jobs.index.JobEntry`), '' when the sweep has none."""
    if not rec.checkpoint_dir:
        return ""
    total = rec.extra.get("total_points", rec.sweep_offset + rec.num_tasks)
    return task_checkpoint_dir(rec.checkpoint_dir, rec.sweep_offset + task, index_width(total))


def index_width(n_points: int) -> int:
    """Digits needed to number N points (at least 3, so listings sort)."""
    return max(3, len(str(max(n_points - 1, 0))))


def differing_directives(headers: Sequence[Sequence[str]]) -> list[str]:
    """The ``#SBATCH`` lines that are not the same for every point (must be none).

    A job array allocates every task alike, so a grid key that changes a directive
    (nodes, GPUs, partition, time...) cannot be swept inside one array.
    """
    first = [ln for ln in headers[0] if ln.lstrip().startswith("#SBATCH")]
    diff: list[str] = []
    for header in headers[1:]:
        lines = [ln for ln in header if ln.lstrip().startswith("#SBATCH")]
        diff += [ln for ln in (set(lines) ^ set(first)) if ln not in diff]
    return sorted(diff)


def dispatcher_script(header: Sequence[str], points_dir: str, offset: int) -> str:
    """The array's batch script: the rendered scripts' own header, then run this task's script.

    Every point's script is the exact ``hpctrain render`` output for its overrides; the
    array script only adds the line that picks the point of ``$SLURM_ARRAY_TASK_ID``.
    ``exec`` keeps the batch shell's pid, so signals and requeue work as in a single job.
    """
    import shlex  # stdlib, only needed here

    directives = [ln for ln in header if ln.lstrip().startswith("#SBATCH")]
    body = [
        "",
        "# hpctrain sweep: every grid point's script is the exact `hpctrain render` output",
        "# for its overrides; this array task runs the one of its index.",
        f"exec bash {shlex.quote(points_dir.rstrip('/'))}/point-$(( {offset} + SLURM_ARRAY_TASK_ID )).sh",
        "",
    ]
    return "\n".join(["#!/bin/bash", *directives, *body])
