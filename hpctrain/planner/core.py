"""The planner's entry point: a request and the hardware in, a ranked plan out (pure).

``recommend`` enumerates the candidate layouts, recommends one (fewest GPUs that fit,
then the highest estimated efficiency), estimates cost when tokens are given, and
raises :class:`PlanError` with the smallest change that would fit when nothing does.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.errors import PlanError
from hpctrain.planner.advice import no_fit_message
from hpctrain.planner.candidates import Candidate, Hardware
from hpctrain.planner.cost import Cost, estimate
from hpctrain.planner.memory import MODES
from hpctrain.planner.search import Request, search


@dataclass(frozen=True)
class Recommendation:
    """The ranked candidates, the recommended one and why, and the cost estimate."""

    request: Request
    hardware: Hardware
    candidates: list[Candidate]
    recommended: Candidate
    reason: str
    cost: Cost | None


def _reason(best: Candidate, fitting: list[Candidate], fixed_nodes: bool) -> str:
    same = [c for c in fitting if c.gpus == best.gpus]
    eff = f"{best.efficiency['total']:.0%}"
    if fixed_nodes:
        return (f"highest estimated efficiency ({eff}) among the {len(fitting)} layouts that "
                f"fit on {best.nodes} node(s), using the fewest GPUs ({best.gpus})")
    return (f"fewest GPUs that fit ({best.gpus}), then the highest estimated efficiency "
            f"({eff}) of the {len(same)} layout(s) on {best.gpus} GPUs that fit")


def recommend(req: Request, hw: Hardware) -> Recommendation:
    """Recommendation ``req`` on ``hw``; :class:`PlanError` (with advice) when nothing fits."""
    validate(req)
    candidates = search(req, hw)
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        raise PlanError(no_fit_message(req, hw, candidates))
    if req.nodes is not None:  # the node count is fixed: efficiency decides, then GPUs
        best = min(fitting, key=lambda c: (-round(c.efficiency["total"], 6), c.gpus,
                                           c.memory.total))
    else:
        best = fitting[0]
    cost = None
    if req.tokens is not None:
        cost = estimate(req.workload.mode, req.workload.params, req.tokens, hw.gpu_peak_tflops,
                        best.gpus, req.mfu, req.price_per_gpu_hour)
    return Recommendation(req, hw, candidates, best, _reason(best, fitting, req.nodes is not None), cost)


def validate(req: Request) -> None:
    """Reject nonsense workload figures with the value and the fix."""
    w = req.workload
    checks = [
        (w.mode in MODES, f"--mode={w.mode!r} is not a mode: use one of {', '.join(MODES)}"),
        (w.params > 0, f"--params={w.params} must be > 0, e.g. 7B"),
        (w.seq_len >= 1, f"--seq-len={w.seq_len} must be >= 1, e.g. 2048"),
        (w.micro_batch >= 1, f"--micro-batch={w.micro_batch} must be >= 1"),
        (0 < w.adapter_fraction < 1,
         f"--adapter-fraction={w.adapter_fraction} must be in (0, 1), e.g. 0.01 for 1%"),
        (req.zero is None or req.zero in (0, 1, 2, 3), f"--zero={req.zero} must be 0, 1, 2 or 3"),
        (0 < req.mfu <= 1, f"--mfu={req.mfu} must be a fraction in (0, 1], e.g. 0.4 for 40%"),
        (req.tokens is None or req.tokens > 0, f"--tokens={req.tokens} must be > 0, e.g. 1T"),
        (req.price_per_gpu_hour is None or req.tokens is not None,
         "--price-per-gpu-hour needs --tokens T (e.g. --tokens 1T) to estimate GPU-hours"),
    ]
    for ok, message in checks:
        if not ok:
            raise PlanError(message)
    if w.mode == "inference" and (req.zero or req.recompute not in (None, "none")):
        raise PlanError("--zero and --recompute apply to training; drop them for --mode inference")
