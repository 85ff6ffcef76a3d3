"""The job spec and what it is checked against: the spec model, its checks, the
partitions' facts and the layout plan. Pure apart from reading spec and partition files.

``from hpctrain.spec import JobSpec`` (the module this package replaced) keeps working.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("JobSpec", "LayoutSpec"):
        from hpctrain.spec import model

        return getattr(model, name)
    raise AttributeError(f"module 'hpctrain.spec' has no attribute {name!r}")
