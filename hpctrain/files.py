"""The one atomic file writer, for every side (records, progress, checkpoints, CLI output).

A reader never sees half a file: the text goes to a temporary file in the same directory
(same file system, so the rename is atomic) and is renamed over the target. ``durable``
adds the fsyncs that make it survive a power loss (the checkpoint manifest and ``latest``
pointer need that; a progress record rewritten every 2 s does not). Standard library
only: cheap to import in every rank.
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = False,
                 mode: int | None = None, tmp_prefix: str = ".") -> None:
    """Replace ``path`` with ``data`` in one rename; on failure the old file stays.

    The temporary file is created new (``O_EXCL``, never following a planted name), with
    exactly ``mode`` when given, else 0666 less the umask like any new file; ``tmp_prefix`` names
    it (the checkpoint code sweeps its own ``.tmp-`` leftovers). Raises OSError.
    """
    path = Path(path)
    # os.urandom, not uuid: uuid imports platform, a cost on every CLI start
    tmp = path.with_name(f"{tmp_prefix}{path.name}.{os.urandom(4).hex()}.tmp")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    # created no more open than ``mode`` (a secret is never readable by others, not even
    # until the chmod), then given exactly ``mode`` whatever the umask
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            fh.write(raw)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_path(path.parent)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or directory by path (a directory's fsync makes renames durable)."""
    fd = os.open(path, os.O_RDONLY)  # read-only opens can fsync directories on Linux
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
