"""A checked spec and its layout plan rendered to an sbatch script (pure), and the
sysadmin's check of templates against the real scheduler.

``from hpctrain.render import render_script`` (the module this package replaced) keeps
working.
"""

from __future__ import annotations

from typing import Any

_COMPAT = ("render", "render_script", "Rendered")


def __getattr__(name: str) -> Any:
    if name in _COMPAT:
        from hpctrain.render import script

        return getattr(script, name)
    raise AttributeError(f"module 'hpctrain.render' has no attribute {name!r}")
