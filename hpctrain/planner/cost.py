"""GPU-hours and cost of a training (or inference) run from its token count.

GPU-hours = flops_per_token x params x tokens / (utilisation x peak FLOP/s per GPU) / 3600,
with 6 FLOPs per parameter per token for training (forward 2 + backward 4; Kaplan et al.
2020, Hoffmann et al. 2022), 4 for LoRA/QLoRA (the frozen weights need no
weight-gradient matmuls) and 2 for inference (forward only). The utilisation is the
model-FLOPs utilisation (MFU) the job reaches, communication and recomputation
included; 40% is the default (Narayanan et al. 2021 report 44-52% on A100 clusters).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.errors import PlanError

FLOPS_PER_PARAM_TOKEN = {"train": 6.0, "lora": 4.0, "qlora": 4.0, "inference": 2.0}
DEFAULT_MFU = 0.40


@dataclass(frozen=True)
class Cost:
    """The estimate and every input it used."""

    gpu_hours: float
    wall_hours: float       # on ``gpus`` GPUs
    gpus: int
    cost: float | None      # gpu_hours x price, when a price was given
    flops: float
    mfu: float
    peak_tflops: float
    flops_per_param_token: float


def estimate(mode: str, params: float, tokens: float, peak_tflops: float, gpus: int,
             mfu: float = DEFAULT_MFU, price_per_gpu_hour: float | None = None) -> Cost:
    """GPU-hours (and cost) to process ``tokens`` tokens on GPUs of ``peak_tflops``."""
    if not 0 < mfu <= 1:
        raise PlanError(f"--mfu={mfu} must be a fraction in (0, 1], e.g. 0.4 for 40%")
    if peak_tflops <= 0:
        raise PlanError(f"peak TFLOPS={peak_tflops} must be > 0: set --gpu-tflops or the "
                        "partition's gpu_peak_tflops")
    if price_per_gpu_hour is not None and price_per_gpu_hour < 0:
        raise PlanError(f"--price-per-gpu-hour={price_per_gpu_hour} must be >= 0")
    per = FLOPS_PER_PARAM_TOKEN[mode]
    return for_flops(per * params * tokens, peak_tflops, gpus, mfu, price_per_gpu_hour, per)


def for_flops(flops: float, peak_tflops: float, gpus: int, mfu: float = DEFAULT_MFU,
              price_per_gpu_hour: float | None = None,
              flops_per_param_token: float = 0.0) -> Cost:
    """GPU-hours (and cost) of ``flops`` model FLOPs at ``mfu`` of ``peak_tflops``: the
    estimate's one formula (``hpctrain report`` asks it for the work a job kept)."""
    gpu_hours = flops / (mfu * peak_tflops * 1e12) / 3600
    return Cost(gpu_hours=gpu_hours, wall_hours=gpu_hours / max(gpus, 1), gpus=gpus,
                cost=None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour,
                flops=flops, mfu=mfu, peak_tflops=peak_tflops,
                flops_per_param_token=flops_per_param_token)


def flops_per_token(mode: str, params: float) -> float:
    """Model FLOPs per token of a ``params``-parameter model (the module docstring)."""
    return FLOPS_PER_PARAM_TOKEN[mode] * params
