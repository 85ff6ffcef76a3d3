"""Options several commands share, defined once so they read and behave the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


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
