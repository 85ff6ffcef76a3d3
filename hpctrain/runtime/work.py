"""What a training step does, as the script says it (``ctx.set_work``, a framework
callback's ``tokens_per_step=``): checked here, carried by the progress record
(:class:`hpctrain.protocol.progress.Work`), turned into throughput, MFU and cost by
``hpctrain report``.

The model's FLOPs per token (or sample) come from the script when it knows them, else from
a parameter count (tokens only: FLOPs per sample need the script's ``flops_per_sample``):
the script's ``params=``, else the job spec's ``[model] params`` (which
``hpctrain plan --write-spec`` writes), exported as ``HPCTRAIN_MODEL_PARAMS``.
"""

from __future__ import annotations

import math

from hpctrain.protocol.progress import MODES, Work


def make_work(*, tokens: float | None = None, samples: float | None = None,
              flops_per_token: float | None = None, flops_per_sample: float | None = None,
              params: float | None = None, spec_params: float | None = None,
              mode: str = "train") -> Work:
    """The :class:`Work` of one step from what the script gives (one of ``tokens`` and
    ``samples``: every rank's together; FLOPs per unit or ``params``), the parameter
    count of the job's spec (``spec_params``, ``mode``) when it gives neither. ValueError
    naming the argument and the fix for anything else."""
    if (tokens is None) == (samples is None):
        raise ValueError("set_work: give tokens= (tokens per optimizer step, every rank's "
                         "together, e.g. global batch x sequence length) or samples=, one "
                         "of them")
    unit, per_step = ("tokens", tokens) if tokens is not None else ("samples", samples)
    flops = flops_per_token if unit == "tokens" else flops_per_sample
    wrong = flops_per_sample if unit == "tokens" else flops_per_token
    if wrong is not None:
        raise ValueError(f"set_work: with {unit}= give flops_per_{unit[:-1]}=, not "
                         f"flops_per_{'sample' if unit == 'tokens' else 'token'}=")
    for name, value in ((unit, per_step), (f"flops_per_{unit[:-1]}", flops), ("params", params)):
        if value is not None and (isinstance(value, bool) or not isinstance(
                value, (int, float)) or not math.isfinite(value) or value <= 0):
            raise ValueError(f"set_work: {name}={value!r} must be a number > 0")
    if params is None and flops is None:
        params = spec_params
    return Work(float(per_step), unit, float(flops or 0), float(params or 0),
                mode if mode in MODES else "train")
