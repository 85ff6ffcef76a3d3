"""Parse and print the sizes a user types: ``70B`` parameters, ``80GB`` of memory, ``1T tokens``.

Counts use SI multipliers (K=1e3, M=1e6, B/G=1e9, T=1e12). Memory is in SI bytes
(1 GB = 1e9 bytes) throughout the planner; ``GiB``/``MiB``/``TiB`` are accepted and
converted exactly (1 GiB = 2**30 bytes). Every parse error is a :class:`PlanError`
naming the value and the accepted forms.
"""

from __future__ import annotations

import math
import re

from hpctrain.errors import PlanError

GB = 1e9  # SI gigabyte: every memory figure the planner prints is in these

_COUNT_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_BYTE_SUFFIX = {
    "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40,
}
_NUMBER = r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"
_COUNT_RE = re.compile(_NUMBER + r"\s*([kmbgt]?)\s*(?:params?|parameters?|tokens?)?", re.I)
_BYTES_RE = re.compile(_NUMBER + r"\s*([kmgt]i?b|b)?", re.I)


def parse_count(text: str | float | int, what: str = "--params",
                within: tuple[float, float] | None = None) -> float:
    """``"70B"`` -> 7e10, ``"1.5T tokens"`` -> 1.5e12, ``"350M"`` -> 3.5e8; must be > 0, and
    within ``within`` (low, high) when given."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _COUNT_RE.fullmatch(str(text).strip())
        if match is None:
            raise PlanError(f"{what}={text!r} is not a count: write e.g. 7B, 350M, 1.5T or "
                            "2e12 (SI suffixes K, M, B, T)")
        value = float(match.group(1)) * _COUNT_SUFFIX[match.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise PlanError(f"{what}={text!r} must be a positive count, e.g. 7B")
    if within is not None and not within[0] <= value <= within[1]:
        raise PlanError(f"{what}={text!r} is out of range: use {_short(within[0])} to "
                        f"{_short(within[1])}")
    return value


def _short(count: float) -> str:
    """1e6 -> '1M', 1e14 -> '100T'."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:g}{suffix}"
    return f"{count:g}"


def parse_gb(text: str | float | int, what: str = "--gpu-mem") -> float:
    """Memory in SI GB: ``"80GB"`` -> 80.0, ``"80GiB"`` -> 85.899..., a bare number is GB."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _BYTES_RE.fullmatch(str(text).strip())
        if match is None:
            raise PlanError(f"{what}={text!r} is not a memory size: write e.g. 80GB, 80GiB "
                            "or 40 (GB, SI: 1 GB = 1e9 bytes)")
        unit = (match.group(2) or "gb").lower()
        value = float(match.group(1)) * _BYTE_SUFFIX[unit] / GB
    if not math.isfinite(value) or value <= 0:
        raise PlanError(f"{what}={text!r} must be a positive memory size, e.g. 80GB")
    return value


def human_count(value: float) -> str:
    """7e10 -> ``"70B"``, 1.3e9 -> ``"1.3B"``, 1.5e12 -> ``"1.5T"`` (for names and tables)."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.4g}"


def gb(nbytes: float) -> float:
    """Bytes -> SI GB, rounded for display and JSON (0.01 GB resolution)."""
    return round(nbytes / GB, 2)
