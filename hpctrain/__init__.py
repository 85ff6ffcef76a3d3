"""hpctrain: take deep-learning training jobs onto SLURM GPU clusters and keep them alive.

Importing this package is cheap (no torch, no submitit): public names are loaded on
first use, so the CLI stays fast on a login node.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.7.0"

# public name -> module that defines it; loaded lazily on first attribute access
_LAZY = {
    "HpctrainError": "hpctrain.errors",
    "JobSpec": "hpctrain.spec.model",
    "render_script": "hpctrain.render.script",
    "CheckpointManager": "hpctrain.checkpoint.manager",
    "submit": "hpctrain.jobs.submit",
    "submit_function": "hpctrain.jobs.submit",
    "submit_sweep": "hpctrain.jobs.submit",
    "Job": "hpctrain.jobs.handle",
    "Layout": "hpctrain.api",
    "Cluster": "hpctrain.remote.client",
    "RemoteJob": "hpctrain.remote.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hpctrain' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
