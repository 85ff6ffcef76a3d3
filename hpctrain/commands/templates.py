"""``hpctrain templates list | show NAME | check [--slurm]``: the sysadmin's view."""

from __future__ import annotations

from pathlib import Path

import click

from hpctrain.commands.options import templates_option
from hpctrain.errors import TemplateError


def _dirs(template_dirs: list[Path]) -> list[Path]:
    from hpctrain.render.script import resolve_dirs
    return resolve_dirs(template_dirs)


def _template_files(dirs: list[Path]) -> dict[str, list[Path]]:
    """Relative template name -> every directory file that defines it, winner first."""
    found: dict[str, list[Path]] = {}
    for d in dirs:
        for f in sorted(d.rglob("*.j2")):
            found.setdefault(f.relative_to(d).as_posix(), []).append(f)
    return dict(sorted(found.items()))


@click.group()
def templates() -> None:
    """List, show and check the partition templates (site dirs over the built-in set)."""


@templates.command("list")
@templates_option
def list_(template_dirs: tuple[str, ...]) -> None:
    """Templates and partitions on the search path, and where each comes from."""
    from hpctrain.spec.partitions import partitions_in

    dirs = _dirs(template_dirs)
    click.echo("search path (first wins):")
    for d in dirs:
        click.echo(f"  {d}")
    click.echo("templates:")
    for name, files in _template_files(dirs).items():
        shadow = f"  (overrides {len(files) - 1} more)" if len(files) > 1 else ""
        click.echo(f"  {name:32} {files[0]}{shadow}")
    click.echo("partitions:")
    names = _template_files(dirs)
    for part in partitions_in(dirs):
        tpl = f"partitions/{part.name}.sbatch.j2"
        used = tpl if tpl in names else "base.sbatch.j2"
        click.echo(f"  {part.name:10} {part.gpus_per_node} x {part.gpu_type} per node, "
                   f"max_nodes={part.max_nodes}, max_time={part.max_time}, template {used}")


@templates.command()
@click.argument("name")
@templates_option
def show(name: str, template_dirs: tuple[str, ...]) -> None:
    """Print a template (e.g. base.sbatch.j2, launchers/srun.j2) or a partition's facts."""
    from hpctrain.spec.partitions import partitions_in

    dirs = _dirs(template_dirs)
    files = _template_files(dirs)
    parts = {p.name: p for p in partitions_in(dirs)}
    candidates = [name, f"{name}.j2", f"{name}.sbatch.j2", f"launchers/{name}.j2"]
    if name in parts:
        part = parts[name]
        click.echo(f"# partition {name}: facts from {part.source}")
        click.echo(Path(part.source).read_text(encoding="utf-8"), nl=False)
        tpl = f"partitions/{name}.sbatch.j2"
        if tpl in files:
            click.echo(f"\n# partition {name}: template {files[tpl][0]}")
            click.echo(files[tpl][0].read_text(encoding="utf-8"), nl=False)
        else:
            click.echo(f"\n# partition {name} renders with base.sbatch.j2 (no {tpl})")
        return
    for cand in candidates:
        if cand in files:
            click.echo(f"# {cand} from {files[cand][0]}")
            click.echo(files[cand][0].read_text(encoding="utf-8"), nl=False)
            return
    raise TemplateError(f"no template or partition named {name!r}: see `hpctrain templates "
                        f"list` (templates: {', '.join(files)}; partitions: {', '.join(parts)})")


@templates.command()
@click.option("--slurm", is_flag=True, help="Also run `sbatch --test-only` on the live cluster.")
@templates_option
def check(slurm: bool, template_dirs: tuple[str, ...]) -> None:
    """Render every partition x launcher x layout; bash -n each; with --slurm, sbatch --test-only."""
    from hpctrain.render.check import format_report, run_checks

    results = run_checks(_dirs(template_dirs), slurm=slurm)
    click.echo(format_report(results))
    failed = [r for r in results if not r.ok]
    if failed:
        raise TemplateError(f"templates check: {len(failed)} of {len(results)} case(s) failed "
                            "(see the report above)")
