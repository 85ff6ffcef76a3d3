"""Options several commands share, defined once so they read and behave the same."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import click

from hpctrain.errors import HpctrainError


def _search_path(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[Path]:
    # The CLI is where the environment is read: --templates, then $HPCTRAIN_TEMPLATES,
    # then the built-in set. Below this, rendering takes the list as given (pure).
    from hpctrain.resources import template_dirs
    return template_dirs(value)


templates_option = click.option(
    "--templates", "template_dirs", multiple=True, type=click.Path(file_okay=False),
    callback=_search_path,
    help="Site template directory layered over $HPCTRAIN_TEMPLATES and the built-in "
         "templates (repeatable; first wins).")

sets_option = click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE",
    help="Override a spec field (repeatable, TOML values), e.g. --set layout.tp=4 --set nodes=2.")


def load_spec(path: str, sets: tuple[str, ...]) -> Any:
    """The job spec at ``path`` with the ``--set`` overrides applied."""
    from hpctrain.spec import JobSpec, parse_set_options

    spec = JobSpec.load(path)
    return spec.with_overrides(parse_set_options(sets)) if sets else spec


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
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
        raise HpctrainError(f"cannot write {str(path)!r}: directory {str(directory)!r} "
                            "does not exist: create it first")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
