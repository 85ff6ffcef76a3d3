"""TOML files a user hands hpctrain (job specs, partition facts), read safely: as bytes, at
most MAX_BYTES of them (``/dev/zero`` is not a spec), decoded as UTF-8 with a named error
(a UTF-8 byte-order mark is allowed; UTF-16 and binary files are refused with the fix), and
parsed with a named error for anything TOML refuses, nesting too deep for the parser
included. Every error names the file.
"""

from __future__ import annotations

import codecs
import os
import tomllib
from pathlib import Path
from typing import Any

from hpctrain.errors import SpecError

MAX_BYTES = 1 << 20     # a spec is a few KiB; a sweep's grid lives on the command line


def read_toml(path: str | os.PathLike[str], error: type[SpecError] = SpecError,
              what: str = "spec") -> dict[str, Any]:
    """The TOML document in ``path`` (a ``what``) as a dict; ``error`` naming it otherwise."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise error(f"cannot read {what} {str(p)!r}: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise error(f"{p}: larger than {MAX_BYTES >> 20} MiB: not a spec file (a spec is a "
                    "few KiB of TOML)")
    text = decode(data, p, error)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{p}: not valid TOML: {exc}") from None
    except RecursionError:
        raise error(f"{p}: not valid TOML: arrays or tables nested too deeply") from None


def decode(data: bytes, path: Path, error: type[SpecError] = SpecError) -> str:
    """``data`` as text: UTF-8 (after a byte-order mark, if any), else ``error``."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise error(f"{path}: the file is UTF-16: save it as UTF-8 (e.g. `iconv -f UTF-16 "
                    f"-t UTF-8 {path.name} > fixed.toml`)")
    data = data.removeprefix(codecs.BOM_UTF8)
    if (nul := data.find(b"\0")) >= 0:
        raise error(f"{path}: a binary file (a NUL byte at offset {nul}): a spec is UTF-8 "
                    "TOML text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {data[exc.start]:#04x} at offset "
                    f"{exc.start}): save the file as UTF-8") from None
