"""What ``CheckpointManager()`` takes from the job's spec when it is not told.

The rendered script exports the spec's ``[checkpoint]`` table to every rank
(``HPCTRAIN_CKPT_DIR``, ``_KEEP_LAST``, ``_KEEP_EVERY``, ``_STRIPE_COUNT``,
``_INTERVAL_STEPS``: :func:`hpctrain.render.script.job_exports`); an argument given to the
manager wins over it, and the spec's defaults (:class:`hpctrain.spec.checkpoint.
CheckpointSpec`) apply where neither says. Outside a job a manager without a directory is
refused, saying what to pass. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain import protocol
from hpctrain.errors import CheckpointError

# the spec's defaults ([checkpoint] in docs/spec.md), for a manager outside a job
KEEP_LAST, INTERVAL_STEPS = 3, 100


@dataclass(frozen=True)
class Settings:
    """The manager's policy, each value from its argument, else the job's spec."""

    root: str
    keep_last: int = KEEP_LAST
    keep_every: int | None = None
    stripe_count: int | None = None
    interval_steps: int = INTERVAL_STEPS


def resolve(root: str | os.PathLike[str] | None, *, keep_last: int | None = None,
            keep_every: int | None = None, stripe_count: int | None = None,
            interval_steps: int | None = None,
            env: Mapping[str, str] | None = None) -> Settings:
    """The settings of a manager given these arguments (None: not given), in a process
    whose environment is ``env`` (default: this one's)."""
    env = os.environ if env is None else env
    if root is None:
        root = env.get(protocol.CKPT_DIR) or None
    if root is None:
        raise CheckpointError(_no_root(env))
    found = Settings(
        root=os.fspath(root),
        keep_last=_given(keep_last, env, protocol.CKPT_KEEP_LAST, KEEP_LAST),
        keep_every=_given(keep_every, env, protocol.CKPT_KEEP_EVERY, None),
        stripe_count=_given(stripe_count, env, protocol.CKPT_STRIPE_COUNT, None),
        interval_steps=_given(interval_steps, env, protocol.CKPT_INTERVAL_STEPS,
                              INTERVAL_STEPS))
    if not isinstance(found.interval_steps, int) or found.interval_steps < 1:
        raise CheckpointError(f"interval_steps={found.interval_steps!r} must be a whole "
                              "number >= 1 (a save is due every that many steps)")
    return found


def _given(value: int | None, env: Mapping[str, str], name: str,
           default: int | None) -> int | None:
    """``value`` if given, else the job's ``$name``, else ``default``."""
    if value is not None:
        return value
    return protocol.env_int(env, name, default, error=CheckpointError,
                            fix="the rendered script sets it from the spec's [checkpoint] "
                                "table; unset it or pass the value to CheckpointManager")


def _no_root(env: Mapping[str, str]) -> str:
    """Why there is no directory, and what to pass."""
    if env.get(protocol.CKPT_INTERVAL_STEPS):   # in an hpctrain job: the spec has no dir
        return ("CheckpointManager() has no directory: the job's spec has no "
                "[checkpoint] dir (add dir = \"/shared/ckpt/NAME\" under [checkpoint]), "
                "or pass one: CheckpointManager(\"/shared/ckpt/run1\")")
    return ("CheckpointManager() has no directory: outside an hpctrain job there is no "
            f"spec to take it from (${protocol.CKPT_DIR} is not set); pass one: "
            "CheckpointManager(\"/shared/ckpt/run1\", keep_last=3)")
