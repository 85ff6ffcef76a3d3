"""``hpctrain render SPEC [--set k=v ...] [-o FILE] [--templates DIR]``."""

from __future__ import annotations

from pathlib import Path

import click

from hpctrain.commands.options import (about_spec, load_spec, sets_option, show_script,
                                       template_cache, templates_option, write_atomically)


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@sets_option
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the script here (atomically) instead of to stdout.")
@click.option("--python", "python", metavar="PATH",
              help="Interpreter that runs the job's supervisor on the batch node (must import "
                   "hpctrain there). Default: this one, as `hpctrain submit` uses.")
@templates_option
def render(spec: str, sets: tuple[str, ...], output: str | None, python: str | None,
           template_dirs: list[Path]) -> None:
    """Check SPEC against its partition and print the sbatch script."""
    import sys

    from hpctrain.jobs.facts import render_here

    job = load_spec(spec, sets)
    with about_spec(spec):
        result = render_here(job, template_dirs, python=python or sys.executable,
                             bytecode_cache=template_cache())
    if output is None:
        show_script(result.script)
        return
    write_atomically(Path(output), result.script, mode=0o755)
    plan = result.plan
    click.echo(f"hpctrain: {output}: {job.name} on {job.partition}, tp={plan.tp} pp={plan.pp} "
               f"dp={plan.dp} world={plan.world} ({plan.nodes} x {plan.gpus_per_node} GPUs, "
               f"{plan.launcher}), template {result.template_path}", err=True)
