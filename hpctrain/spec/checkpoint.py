"""``[checkpoint]``: where the job checkpoints, how often, and what it keeps.

The rendered script exports the table to every rank as ``HPCTRAIN_CKPT_*``
(:func:`hpctrain.render.script.job_exports`), and ``CheckpointManager()`` without arguments
takes it from there (:mod:`hpctrain.checkpoint.settings`): the spec is the one place a
job's checkpoint policy is written down. Field reference: docs/spec.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.errors import SpecError
from hpctrain.spec.checks import check_int, check_opt_int, check_table, check_text
from hpctrain.spec.runenv import access_level


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often the job checkpoints, and which steps it keeps."""

    dir: str | None = None
    interval_steps: int = 100         # CheckpointManager.due(step): every this many steps
    keep_last: int = 3                # the newest valid steps kept
    keep_every: int | None = None     # ...and every step divisible by it (milestones)
    stripe_count: int | None = None   # Lustre stripes (-1 = all OSTs), applied when lfs exists
    access: str = "private"           # who may read the checkpoints: "private" or "group"

    @classmethod
    def from_dict(cls, data: Any) -> CheckpointSpec:
        d = check_table(data, "checkpoint", cls)
        ckpt_dir = d.get("dir")
        if ckpt_dir is not None:
            check_text(ckpt_dir, "checkpoint.dir")
            if not ckpt_dir.startswith("/"):
                raise SpecError(f"checkpoint.dir={ckpt_dir!r} must be an absolute path on "
                                "storage every node sees (e.g. /shared/ckpt/NAME)")
        stripes = d.get("stripe_count")
        if stripes is not None and (check_int(stripes, "checkpoint.stripe_count", -1) == 0):
            raise SpecError("checkpoint.stripe_count=0 means nothing: use -1 (all OSTs) or "
                            "a positive count, or leave it out")
        return cls(dir=ckpt_dir, stripe_count=stripes,
                   access=access_level(d.get("access", "private"), "checkpoint.access"),
                   interval_steps=check_int(d.get("interval_steps", 100),
                                            "checkpoint.interval_steps", 1),
                   keep_last=check_int(d.get("keep_last", 3), "checkpoint.keep_last", 1),
                   keep_every=check_opt_int(d.get("keep_every"), "checkpoint.keep_every", 1))
