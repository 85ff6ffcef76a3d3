"""``--set key=value`` (and a sweep's grid points) as the overrides a spec takes
(:meth:`hpctrain.spec.model.JobSpec.with_overrides`): the one place a value typed on the
command line becomes a spec value."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from typing import Any

from hpctrain.errors import SpecError


def parse_set_options(items: Sequence[str]) -> dict[str, Any]:
    """Parse ``--set key=value`` items; values are TOML (4, true, ["a"]) or else plain text.

    ``time=00:30:00`` stays the string "00:30:00" (TOML would read a time of day). An
    environment variable's value (``run.env.NAME``) is text as typed: ``1.10``, ``3e-4`` and
    ``0x10`` are exported as written (a quoted TOML string loses its quotes).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(f"--set {item!r}: use key=value, e.g. --set layout.tp=4")
        value = _toml_value(raw.strip())
        if key.startswith("run.env.") and not isinstance(value, str):
            value = raw.strip()
        out[key] = value
    return out


def _toml_value(raw: str) -> Any:
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    # TOML dates and times are not spec values: keep what the user typed
    return value if isinstance(value, (str, int, float, bool, list, dict)) else raw
