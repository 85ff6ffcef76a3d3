"""``hpctrain templates list | show NAME | check [--slurm]``: the sysadmin's view."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from hpctrain.commands.options import templates_option
from hpctrain.errors import HpctrainError, TemplateError


def _site(template_dirs: list[Path]) -> Any:
    from hpctrain.jobs.facts import site
    return site(template_dirs)


def _template_files(dirs: list[Path]) -> dict[str, list[Path]]:
    """Relative template name -> every directory file that defines it, winner first."""
    found: dict[str, list[Path]] = {}
    for d in dirs:
        for f in sorted(d.rglob("*.j2")):
            found.setdefault(f.relative_to(d).as_posix(), []).append(f)
    return dict(sorted(found.items()))


def _facts_text(part: Any) -> str:
    """A partition's facts as its file says them, or as TOML where Slurm said them."""
    if Path(part.source).is_file():
        return Path(part.source).read_text(encoding="utf-8")
    from dataclasses import asdict

    from hpctrain.spec.tomlwriter import dumps
    return dumps({k: v for k, v in asdict(part).items()
                  if k != "source" and v not in (None, "", [], {}, ())})


@click.group()
def templates() -> None:
    """List, show and check the partition templates (site dirs over the built-in set)."""


@templates.command("list")
@templates_option
def list_(template_dirs: tuple[str, ...]) -> None:
    """Templates and partitions (facts files and Slurm's), and where each comes from."""
    site = _site(template_dirs)
    dirs = site.search()
    click.echo("search path (first wins):")
    for d in dirs:
        click.echo(f"  {d}")
    click.echo("templates:")
    for name, files in _template_files(dirs).items():
        shadow = f"  (overrides {len(files) - 1} more)" if len(files) > 1 else ""
        click.echo(f"  {name:32} {files[0]}{shadow}")
    click.echo("partitions:")
    names = _template_files(dirs)
    for part, source in site.partitions():
        tpl = f"partitions/{part.name}.sbatch.j2"
        used = tpl if tpl in names else "base.sbatch.j2"
        click.echo(f"  {part.name:10} {part.gpus_per_node} x {part.gpu_type} per node, "
                   f"{part.cpus_per_node} CPUs, {part.mem_per_node_gb:g} GB, "
                   f"max_nodes={part.max_nodes}, max_time={part.max_time}, template {used}; "
                   f"facts: {source}")


@templates.command()
@click.argument("name")
@templates_option
def show(name: str, template_dirs: tuple[str, ...]) -> None:
    """Print a template (e.g. base.sbatch.j2, launchers/srun.j2) or a partition's facts."""
    from hpctrain.spec.partitions import partition_names

    site = _site(template_dirs)
    dirs = site.search()
    files = _template_files(dirs)
    parts = partition_names(dirs)
    candidates = [name, f"{name}.j2", f"{name}.sbatch.j2", f"launchers/{name}.j2"]
    part = None
    if name in parts:
        part = site.partition(name)                 # its file, over Slurm's word if partial
    elif not any(c in files for c in candidates):
        try:
            part = site.partition(name)             # Slurm's word alone
        except HpctrainError:
            pass
    if part is not None:
        click.echo(f"# partition {name}: facts from {part.source}")
        click.echo(_facts_text(part), nl=False)
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
@click.argument("names", nargs=-1)
@click.option("--from-slurm", "from_slurm", is_flag=True, required=True,
              help="Start from what Slurm says of each partition (the only source so far).")
@click.option("--dir", "out_dir", type=click.Path(file_okay=False),
              help="Write DIR/partitions/NAME.toml (a site directory); default: print.")
@click.option("--force", is_flag=True, help="Overwrite a facts file that exists.")
def init(names: tuple[str, ...], from_slurm: bool, out_dir: str | None, force: bool) -> None:
    """Write starting facts files for NAMES (default: every partition Slurm has)."""
    from hpctrain.commands.options import write_atomically
    from hpctrain.jobs.facts import slurm_word
    from hpctrain.slurm.partitions import names as slurm_names
    from hpctrain.spec import slurmfacts

    for name in names or slurm_names():
        word = slurm_word(name)
        if word is None:
            raise TemplateError(f"Slurm has no partition {name!r}: `sinfo -s` lists them")
        text = slurmfacts.facts_file(slurmfacts.facts(*word))
        if out_dir is None:
            click.echo(text)
            continue
        path = Path(out_dir) / "partitions" / f"{name}.toml"
        if path.exists() and not force:
            raise TemplateError(f"{path} exists: keep it, or pass --force to overwrite it")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text, mode=0o644)
        click.echo(f"wrote {path}: check it, then fill in what Slurm does not know", err=True)


@templates.command()
@click.option("--slurm", is_flag=True, help="Also run `sbatch --test-only` on the live cluster.")
@templates_option
def check(slurm: bool, template_dirs: tuple[str, ...]) -> None:
    """Render every partition x launcher x layout; bash -n each; with --slurm, sbatch --test-only."""
    from hpctrain.render.check import format_report, run_checks

    site = _site(template_dirs)
    try:
        parts = [p for p, _ in site.partitions()]   # the files', over Slurm's word, and Slurm's
    except HpctrainError:
        parts = None                                # run_checks reports what is wrong
    results = run_checks(site.search(), slurm=slurm, partitions=parts,
                         devcluster=site.devcluster)
    click.echo(format_report(results))
    failed = [r for r in results if not r.ok]
    if failed:
        raise TemplateError(f"templates check: {len(failed)} of {len(results)} case(s) failed "
                            "(see the report above)")
