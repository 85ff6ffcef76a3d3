"""``hpctrain render SPEC [--set k=v ...] [-o FILE] [--templates DIR]``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from hpctrain.commands.options import load_spec, sets_option, templates_option
from hpctrain.errors import SpecError


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@sets_option
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the script here (atomically) instead of to stdout.")
@templates_option
def render(spec: str, sets: tuple[str, ...], output: str | None,
           template_dirs: list[Path]) -> None:
    """Check SPEC against its partition and print the sbatch script."""
    from hpctrain.render import render as do_render

    job = load_spec(spec, sets)
    result = do_render(job, template_dirs)
    if output is None:
        click.echo(result.script, nl=False)
        return
    write_atomically(Path(output), result.script)
    plan = result.plan
    click.echo(f"hpctrain: {output}: {job.name} on {job.partition}, tp={plan.tp} pp={plan.pp} "
               f"dp={plan.dp} world={plan.world} ({plan.nodes} x {plan.gpus_per_node} GPUs, "
               f"{plan.launcher}), template {result.template_path}", err=True)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename: a failed write leaves the old file.

    Only regular files are replaced; anything else that exists (/dev/stdout, a FIFO,
    /dev/null) is written to in place, never renamed over.
    """
    if path.exists() and not path.is_file():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise SpecError(f"-o {str(path)!r}: directory {str(directory)!r} does not exist: create it first")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
