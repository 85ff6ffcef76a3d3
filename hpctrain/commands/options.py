"""Options several commands share, defined once so they read and behave the same."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from hpctrain.errors import HpctrainError
from hpctrain.files import atomic_write


def _search_path(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[Path]:
    # The CLI is where the environment is read: --templates, then $HPCTRAIN_TEMPLATES,
    # then the built-in set. Below this, rendering takes the list as given (pure).
    from hpctrain.spec.site import template_dirs
    return template_dirs(value)


templates_option = click.option(
    "--templates", "template_dirs", multiple=True, type=click.Path(file_okay=False),
    callback=_search_path,
    help="Site template directory layered over $HPCTRAIN_TEMPLATES and the built-in "
         "templates (repeatable; first wins).")

sets_option = click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE",
    help="Override a spec field (repeatable, TOML values), e.g. --set layout.tp=4 --set nodes=2.")

# the job spec a command submits (submit, sweep; here and over --host)
spec_argument = click.argument("spec_file", metavar="SPEC", type=click.Path(dir_okay=False))

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")

grid_option = click.option(
    "--grid", "grids", multiple=True, required=True, metavar="KEY=V1,V2",
    help="A spec key and its values (repeatable; the sweep is their product).")

# where the job folders go, on this machine
folder_option = click.option(
    "--folder", type=click.Path(file_okay=False), default=None,
    help="Root of job folders [default: $HPCTRAIN_JOBS_DIR or ~/hpctrain-jobs].")


def visible(text: str) -> str:
    """``text`` with every character a terminal would act on instead of show (ESC, CR,
    backspace, bidirectional overrides...) written as an escape (``\\x1b``, ``\\x0d``, ``\\u202e``):
    a value can then never hide or rewrite a line of what a user reads before queueing."""
    return "".join(c if c.isprintable() or c in "\n\t" else
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}") for c in text)


def show_script(text: str) -> None:
    """A rendered script to stdout: byte for byte into a file or a pipe (what ``submit``
    sends and ``render -o`` writes: click would strip ANSI codes there unless told not to),
    with :func:`visible` escapes on a terminal."""
    import sys

    click.echo(visible(text) if sys.stdout.isatty() else text, nl=False, color=True)


def job_ids(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Click callback: every JOB_ID argument checked by the one rule (hpctrain.jobs.ids)."""
    from hpctrain.jobs.ids import check_job_id

    if value is None:
        return value
    return tuple(map(check_job_id, value)) if isinstance(value, tuple) else check_job_id(value)


@contextmanager
def about_spec(path: str) -> Iterator[None]:
    """A spec error raised inside (its layout, its partition, a check before the queue)
    names the spec file, as an error in reading it does."""
    from hpctrain.errors import SpecError

    try:
        yield
    except SpecError as exc:
        if str(exc).startswith(f"{path}:"):
            raise
        raise type(exc)(f"{path}: {exc}") from None


def load_spec(path: str, sets: tuple[str, ...]) -> Any:
    """The job spec at ``path`` with the ``--set`` overrides applied."""
    from hpctrain.spec.model import JobSpec
    from hpctrain.spec.overrides import parse_set_options

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
    atomic_write(path, text, mode=mode)


def template_cache() -> Any:
    """A Jinja bytecode cache in the user's own cache dir (``<cache>/templates``, 0700), or
    None when that directory is not safely ours: compiled templates are code, so a
    directory another user could write is never used. Failures to write are ignored."""
    import stat

    import jinja2

    from hpctrain.jobs.paths import cache_dir

    class QuietCache(jinja2.FileSystemBytecodeCache):
        def dump_bytecode(self, bucket: Any) -> None:
            try:
                super().dump_bytecode(bucket)
            except OSError:
                pass  # a full or read-only home only costs the next render its compile

    path = cache_dir() / "templates"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return QuietCache(str(path), "%s.jinja")
