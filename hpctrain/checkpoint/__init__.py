"""Atomic, sharded, async, verified checkpoints for shared (Lustre-style) storage.

Importing this package is cheap (no torch): names load on first use, so
``hpctrain ckpt list`` stays fast. See docs/checkpoint.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CheckpointManager": "hpctrain.checkpoint.manager",
    "list_steps": "hpctrain.checkpoint.catalog",
    "verify_step": "hpctrain.checkpoint.reader",
    "read_manifest": "hpctrain.checkpoint.reader",
    "save_deepspeed": "hpctrain.checkpoint.deepspeed_io",
    "load_deepspeed": "hpctrain.checkpoint.deepspeed_io",
    "read_tensors": "hpctrain.checkpoint.export",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hpctrain.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
