"""``hpctrain sweep SPEC --grid key=v1,v2 ...``: a grid as ONE Slurm job array."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from hpctrain.commands.options import (about_spec, folder_option, grid_option, json_option,
                                       load_spec, sets_option, spec_argument,
                                       templates_option)
from hpctrain.jobs.sweep import parse_grid, point_label
from hpctrain.spec.model import JobSpec


@click.command()
@spec_argument
@grid_option
@click.option("--max-parallel", type=int, default=None,
              help="At most this many grid points run at once (--array=...%K).")
@sets_option
@templates_option
@folder_option
@click.option("--dry-run", is_flag=True, help="List the points and arrays; submit nothing.")
@json_option
def sweep(spec_file: str, grids: tuple[str, ...], max_parallel: int | None,
          sets: tuple[str, ...], template_dirs: list[Any], folder: str | None,
          dry_run: bool, as_json: bool) -> int:
    """Submit the cartesian product of the --grid values as one job array.

    Every point gets its own overrides and its own checkpoint subdirectory
    (CHECKPOINT_DIR/point-NNN); arrays above the cluster's MaxArraySize are split.
    """
    spec = load_spec(spec_file, sets)
    with about_spec(spec_file):
        return run_sweep(spec, parse_grid(grids), max_parallel=max_parallel,
                         template_dirs=template_dirs, folder=folder, dry_run=dry_run,
                         as_json=as_json, spec_path=os.path.abspath(spec_file))


def run_sweep(spec: JobSpec, grid: dict[str, list[str]], *, max_parallel: int | None,
              template_dirs: list[Any], folder: str | None, dry_run: bool, as_json: bool,
              spec_path: str, origin: Any = None, snapshot_default: bool = False) -> int:
    """``sweep``'s work and output, shared with the cluster side of ``--host``."""
    if dry_run:
        return _dry_run(spec, grid, max_parallel, template_dirs, as_json)
    from hpctrain.jobs.submit import submit_sweep  # imports submitit: only when submitting

    sw = submit_sweep(spec, grid, max_parallel=max_parallel, folder=folder,
                      templates=template_dirs, spec_path=spec_path, origin=origin,
                      snapshot_default=snapshot_default)
    snapshot = sw.arrays[0].extra.get("snapshot", "")
    if as_json:
        click.echo(json.dumps({"sweep_id": sw.sweep_id, "points": len(sw.points),
                               "arrays": [{"job_id": a.job_id, "array": a.extra["array"],
                                           "offset": a.sweep_offset} for a in sw.arrays],
                               "folder": sw.arrays[0].folder, "snapshot": snapshot}))
        return 0
    click.echo(f"submitted sweep {sw.sweep_id}: {len(sw.points)} points as "
               f"{len(sw.arrays)} job array(s)")
    for a in sw.arrays:
        click.echo(f"  array {a.job_id}  --array={a.extra['array']}  points "
                   f"{a.sweep_offset}..{a.sweep_offset + a.num_tasks - 1}")
    if snapshot:
        click.echo(f"  snapshot: {snapshot} (every point runs {sw.arrays[0].extra['snapshot_dir']})")
    click.echo(f"  status:  hpctrain status {sw.sweep_id}    (tasks: JOBID_TASK, e.g. "
               f"hpctrain logs {sw.arrays[0].job_id}_0)")
    return 0


def _dry_run(spec: JobSpec, grid: dict[str, list[str]], max_parallel: int | None,
             templates: list[Any], as_json: bool) -> int:
    from hpctrain.jobs.precheck import precheck
    from hpctrain.jobs.submit import render_sweep
    from hpctrain.jobs.sweep import plan_arrays

    precheck(spec)     # what would fail the jobs at their start, said before the queue
    # every point must validate and render, with the same allocation
    points, specs, _, _ = render_sweep(spec, grid, templates)
    chunks = plan_arrays(len(points), max_parallel, 10**9)
    if as_json:
        click.echo(json.dumps({"dry_run": True, "points": points,
                               "array": chunks[0].array_option}))
        return 0
    click.echo(f"{len(points)} points, one job array --array={chunks[0].array_option} "
               "(split further if above the cluster's MaxArraySize)")
    for i, (p, s) in enumerate(zip(points, specs)):
        click.echo(f"  {i:>4}  {point_label(p)}  checkpoint={s.checkpoint.dir or '-'}")
    click.echo("dry run: nothing was submitted", err=True)
    return 0
