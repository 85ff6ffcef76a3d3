"""Shell safety for rendered scripts: the quoting filters and the one type that may go into
a script as is (:class:`ShellSafe`). Pure.

- ``shq`` quotes with :func:`shlex.quote` (a list becomes space-separated words);
- ``directive`` lets through only values that need no quoting on an ``#SBATCH`` line;
- ``envname`` lets through only shell variable names.

Values that cannot be made safe (NUL, a newline on a directive line) are refused.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import jinja2

from hpctrain.errors import TemplateError
from hpctrain.spec.checks import DIRECTIVE_VALUE_RE, ENV_KEY_RE


class ShellSafe(str):
    """Text that may go into the script as is: quoted, checked, or template-made."""


def shq(value: Any) -> ShellSafe:
    """Shell-quote one value, or a list of values into space-separated words."""
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises here, naming the missing variable
    if isinstance(value, (list, tuple)):
        return ShellSafe(" ".join(shq(v) for v in value))
    if isinstance(value, bool) or value is None or not isinstance(value, (str, int, float, Path)):
        raise TemplateError(f"shq: cannot quote {value!r} ({type(value).__name__}): pass a "
                            "string, a number or a list of them")
    text = str(value)
    if "\0" in text:
        raise TemplateError(f"shq: {text!r} contains a NUL byte, which bash cannot hold")
    return ShellSafe(shlex.quote(text))


def directive(value: Any) -> ShellSafe:
    """A value for an ``#SBATCH`` line: allowed only when it needs no quoting at all."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not DIRECTIVE_VALUE_RE.match(text):
        raise TemplateError(f"{value!r} cannot go on an #SBATCH line (spaces, quotes, $, "
                            "newlines and the like are refused): fix the value")
    return ShellSafe(text)


def envname(value: Any) -> ShellSafe:
    """A shell variable name, checked."""
    if not isinstance(value, str) or not ENV_KEY_RE.match(value):
        raise TemplateError(f"{value!r} is not a shell variable name")
    return ShellSafe(value)
