"""``hpctrain ckpt list|verify|prune|export``: inspect, tidy and export a checkpoint root
(no torch import, except ``export``, which builds tensors)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from hpctrain.commands.table import table

from hpctrain.errors import CheckpointCorrupt, CheckpointError

root_arg = click.argument("root", type=click.Path(file_okay=False, path_type=Path))


@click.group()
def ckpt() -> None:
    """List, verify and prune checkpoints written by hpctrain's CheckpointManager."""


@ckpt.command("list")
@root_arg
@click.option("--json", "as_json", is_flag=True, help="One JSON array on stdout.")
@click.option("--verify", is_flag=True, help="Read every byte and check checksums (slow).")
def list_cmd(root: Path, as_json: bool, verify: bool) -> None:
    """Committed steps under ROOT with size, time and validity."""
    from hpctrain.checkpoint.catalog import list_steps

    infos = list_steps(root, verify=verify)
    if as_json:
        click.echo(json.dumps([i.to_json() for i in infos], indent=1))
        return
    if not infos:
        click.echo(f"no checkpoints in {root}")
        return
    rows = []
    for i in infos:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(i.created)) if i.created else "?"
        rows.append([i.step, _size(i.bytes), i.world_size, i.kind, when,
                     "ok" if i.valid else f"BAD: {i.problem}"])
    click.echo(table(["step", "size", "world", "kind", "saved (UTC)", "status"], rows,
                     right={0, 1, 2}, max_width=400))


@ckpt.command()
@root_arg
@click.option("--step", type=int, default=None, help="Verify only this step [default: all].")
def verify(root: Path, step: int | None) -> None:
    """Check every byte of every (or one) step against its manifest; exit 1 on damage."""
    from hpctrain.checkpoint.catalog import list_steps
    from hpctrain.checkpoint.reader import verify_step
    from hpctrain.checkpoint.manifest import step_dirname

    steps = [i.step for i in list_steps(root)]
    if not steps:
        # "0 checkpoint(s) verified" with exit 0 would let `verify && delete-the-backup` go
        # ahead on an empty directory or the parent of the real root
        below = sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
        roots = [str(d) for d in below[:100] if list_steps(d)][:5]
        hint = f" (checkpoints are in {', '.join(roots)})" if roots else ""
        raise CheckpointError(f"no checkpoint in {root}{hint}: nothing was verified; pass "
                              "the checkpoint root (the directory holding the step_* "
                              "directories)")
    if step is not None:
        if step not in steps:
            raise CheckpointError(f"no checkpoint for step {step} in {root}: choose one of {steps}")
        steps = [step]
    bad = 0
    for s in steps:
        problems = verify_step(root / step_dirname(s))
        click.echo(f"step {s}: " + ("ok" if not problems else "; ".join(problems)))
        bad += bool(problems)
    if bad:
        raise CheckpointCorrupt(f"{bad} of {len(steps)} checkpoint(s) in {root} failed "
                              "verification (files named above): delete them or restore "
                              "from a copy; load_latest skips them")
    click.echo(f"{len(steps)} checkpoint(s) verified")


@ckpt.command()
@root_arg
@click.option("--keep", type=click.IntRange(min=1), required=True,
              help="Keep this many newest valid steps.")
@click.option("--keep-every", type=click.IntRange(min=1), default=None,
              help="Also keep every step divisible by this.")
def prune(root: Path, keep: int, keep_every: int | None) -> None:
    """Delete old steps crash-safely (refused while a job holds ROOT's lock)."""
    from hpctrain.checkpoint import catalog, storage

    if not root.is_dir():
        raise CheckpointError(f"checkpoint root {root} does not exist: pass the job's root")
    lock = storage.RootLock(root, wait_s=0)  # a login node does not wait
    try:
        storage.clean_leftovers(root)
        deleted = catalog.prune(root, keep, keep_every)
    finally:
        lock.release()
    click.echo(f"deleted {len(deleted)} step(s): {deleted}" if deleted else "nothing to delete")


@ckpt.command()
@root_arg
@click.option("--step", type=int, default=None, help="The step to export [default: the newest "
              "valid one].")
@click.option("--to", "fmt", type=click.Choice(["torch", "safetensors", "dcp"]), required=True,
              help="torch: one file for torch.load; safetensors: one .safetensors file; "
                   "dcp: a torch.distributed.checkpoint directory.")
@click.option("--only", default=None, metavar="KEY",
              help="Only the tensors under this top-level key, named without it "
                   "(--only model: names as in model.state_dict()).")
@click.argument("out", type=click.Path(path_type=Path))
def export(root: Path, step: int | None, fmt: str, only: str | None, out: Path) -> None:
    """Write a step's tensors, whole (reassembled from every rank's shards), to OUT."""
    from hpctrain.checkpoint.catalog import list_steps
    from hpctrain.checkpoint.export import export as write
    from hpctrain.checkpoint.manifest import step_dirname

    infos = list_steps(root)
    valid = [i.step for i in infos if i.valid]
    if step is None and not valid:
        raise CheckpointError(f"no valid checkpoint in {root} to export")
    if step is not None and step not in [i.step for i in infos]:
        raise CheckpointError(f"no checkpoint for step {step} in {root}: choose one of {valid}")
    step = valid[-1] if step is None else step
    count = write(root / step_dirname(step), fmt, out, only=only)
    click.echo(f"exported {count} tensor(s) of step {step} to {out} ({fmt})")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
