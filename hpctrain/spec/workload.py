"""``[model]``: the model a job trains, as far as hpctrain needs it: its parameter count and
how it is trained. The rendered script exports it (``HPCTRAIN_MODEL_PARAMS``,
``HPCTRAIN_MODEL_MODE``) so that a step's model FLOPs are known without the script saying
them (``ctx.set_work(tokens=...)``: ``hpctrain report``'s MFU); ``hpctrain plan
--write-spec`` writes it from ``--params`` and ``--mode``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpctrain.errors import SpecError
from hpctrain.protocol.progress import MODES
from hpctrain.spec.checks import check_table, closest

# a model the planner can reason about (hpctrain plan --params takes the same range)
MIN_PARAMS, MAX_PARAMS = 1e6, 1e14


@dataclass(frozen=True)
class ModelSpec:
    """``params``: the parameter count (7e9, or 7_000_000_000); ``mode``: train, lora,
    qlora or inference (6, 4, 4 or 2 FLOPs per parameter and token)."""

    params: float
    mode: str = "train"

    @classmethod
    def from_dict(cls, data: Any) -> ModelSpec:
        d = check_table(data, "model", cls)
        params = d.get("params")
        if isinstance(params, bool) or not isinstance(params, (int, float)) or \
                not math.isfinite(params) or not MIN_PARAMS <= params <= MAX_PARAMS:
            raise SpecError(f"model.params={params!r} must be the model's parameter count, "
                            f"a number from {MIN_PARAMS:.0e} to {MAX_PARAMS:.0e} (e.g. "
                            "params = 7e9 for a 7B model)")
        mode = d.get("mode", "train")
        if mode not in MODES:
            raise SpecError(f"model.mode={mode!r} is not a mode: use one of "
                            f"{', '.join(MODES)}" + closest(str(mode), MODES))
        return cls(float(params), mode)
