"""The transformer shape behind a parameter count: layers, hidden size, attention heads.

Activation and KV-cache memory, and the divisibility checks on tp and pp, need the
shape. When the user gives ``--layers/--hidden/--heads`` those are used; otherwise a
shape is *assumed* and the assumption is printed: the published shape of the nearest
well-known model when the count is within 25% of one (GPT-3 / Llama family), else a
GPT-style shape with hidden = 128 x layers (the aspect ratio of GPT-3 175B and
Llama 7B/13B) and 128-wide heads, solved from params ~= 12 x layers x hidden^2 and
rounded to a multiple of 4 layers and 8 heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpctrain.errors import PlanError

# (params, layers, hidden, heads, name): published shapes (GPT-3 paper Table 2.1,
# LLaMA and Llama 2 papers)
KNOWN_SHAPES: tuple[tuple[float, int, int, int, str], ...] = (
    (125e6, 12, 768, 12, "GPT-3 Small"),
    (350e6, 24, 1024, 16, "GPT-3 Medium"),
    (1.3e9, 24, 2048, 16, "GPT-3 XL"),  # paper: 24 heads x 128 != 2048; 16 x 128
    (2.7e9, 32, 2560, 32, "GPT-3 2.7B"),
    (7e9, 32, 4096, 32, "Llama-2-7B"),
    (13e9, 40, 5120, 40, "Llama-2-13B"),
    (32.5e9, 60, 6656, 52, "LLaMA-33B"),
    (70e9, 80, 8192, 64, "Llama-2-70B"),
    (175e9, 96, 12288, 96, "GPT-3 175B"),
)
_NEAR = 1.25  # a known shape is used when params is within this factor of it


@dataclass(frozen=True)
class Arch:
    """A transformer's shape; ``assumed`` says where it came from when not given."""

    layers: int
    hidden: int
    heads: int
    assumed: str = ""  # empty when the user gave every figure
    given: tuple[str, ...] = ("layers", "hidden", "heads")  # the figures the user gave

    def layer_params(self) -> float:
        """Weights in one transformer layer (attention 4h^2 + MLP 8h^2)."""
        return 12.0 * self.hidden**2


def _derived(params: float) -> tuple[int, int, int, str]:
    for known, layers, hidden, heads, name in KNOWN_SHAPES:
        if known / _NEAR <= params <= known * _NEAR:
            return layers, hidden, heads, f"shape of {name}"
    layers = max(2, round((params / (12 * 128**2)) ** (1 / 3)))
    heads = max(1, round(math.sqrt(params / (12 * layers)) / 128))
    # round to multiples of 4 layers and 8 heads, as real models do, so the usual pp and
    # tp degrees pass the divisibility checks made on this assumed shape
    layers = 4 * max(1, round(layers / 4)) if layers >= 8 else layers
    heads = 8 * max(1, round(heads / 8)) if heads >= 8 else heads
    return layers, heads * 128, heads, ("GPT-style shape (12 x layers x hidden^2 = params, "
                                        "128-wide heads, 4k layers, 8k heads)")


def resolve_arch(params: float, layers: int | None, hidden: int | None,
                 heads: int | None) -> Arch:
    """The user's shape where given, the assumed one for the rest, validated."""
    for flag, value in (("--layers", layers), ("--hidden", hidden), ("--heads", heads)):
        if value is not None and value < 1:
            raise PlanError(f"{flag}={value} must be >= 1")
    d_layers, d_hidden, d_heads, source = _derived(params)
    missing = [f for f, v in (("layers", layers), ("hidden", hidden), ("heads", heads)) if v is None]
    if heads is None and hidden is not None:
        # keep heads consistent with the user's hidden size: 128-wide heads when possible
        d_heads = hidden // 128 if hidden % 128 == 0 else math.gcd(hidden, d_heads)
    if hidden is None and heads is not None:
        # the nearest hidden size the user's heads divide
        d_hidden = heads * max(1, round(d_hidden / heads))
    arch = Arch(layers=layers or d_layers, hidden=hidden or d_hidden, heads=heads or d_heads,
                assumed=(f"{', '.join(missing)} assumed from the {source}; pass "
                         + " ".join(f"--{m}" for m in missing) + " to use yours")
                if missing else "",
                given=tuple(f for f in ("layers", "hidden", "heads") if f not in missing))
    if arch.hidden % arch.heads:
        raise PlanError(f"--hidden={arch.hidden} is not divisible by --heads={arch.heads}: "
                        "choose heads that divide the hidden size")
    return arch
