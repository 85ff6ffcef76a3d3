"""A small TOML writer for job specs (the stdlib reads TOML but does not write it).

Handles what a spec holds: strings, integers, floats, booleans, lists of those, and
nested tables. Output is stable (keys in the given order) so rendered specs diff well.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n",
            "\f": "\\f", "\r": "\\r"}


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")   # TOML forbids raw control characters
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else _string(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")


def dumps(data: Mapping[str, Any], _prefix: str = "") -> str:
    """TOML text for a nested dict: scalars first, then one [table] per nested dict."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, Mapping)]
    text = "\n".join(lines) + ("\n" if lines else "")
    for k, v in data.items():
        if isinstance(v, Mapping):
            name = f"{_prefix}{_key(k)}"
            body = dumps(v, f"{name}.")
            text += f"\n[{name}]\n{body}"
    return text
