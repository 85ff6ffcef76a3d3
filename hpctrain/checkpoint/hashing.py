"""Checksums over checkpoint files (no torch): one per block, verified by streaming reads.

The algorithm is the one the manifest names (hpctrain.checkpoint.checksum: crc32c where
the CPU computes it, crc32 in checkpoints from before 0.3).
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.checkpoint import checksum
from hpctrain.checkpoint.checksum import Checksum
from hpctrain.checkpoint.manifest import MANIFEST, FileRecord, Manifest, parse
from hpctrain.errors import CheckpointError

READ_CHUNK = 16 << 20  # large sequential reads; Lustre and local disks both like >= 1 MiB


def read_manifest(step_dir: str | os.PathLike[str]) -> Manifest:
    """Read and validate ``step_dir/manifest.json``; CheckpointError if absent or bad."""
    path = Path(step_dir) / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: {step_dir} is not a committed checkpoint "
                              "(an interrupted save); delete it") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from None
    return parse(data, where=str(path))


def check_sizes(step_dir: Path, manifest: Manifest) -> str | None:
    """Cheap check (stat only): every file exists with its recorded size. None if fine."""
    for rec in manifest.files:
        try:
            size = (step_dir / rec.name).stat().st_size
        except OSError:
            return f"{step_dir / rec.name} is missing"
        if size != rec.size:
            return f"{step_dir / rec.name} has {size} bytes, manifest says {rec.size} (truncated?)"
    return None


def verify_file(path: Path, rec: FileRecord, algorithm: str = checksum.LEGACY) -> str | None:
    """Stream ``path`` and check size and every block's checksum (``algorithm``, as the
    manifest names it); a problem string or None."""
    fn: Checksum = checksum.get(algorithm)
    try:
        size = path.stat().st_size
        if size != rec.size:
            return f"{path} has {size} bytes, manifest says {rec.size} (truncated or damaged)"
        buf = bytearray(READ_CHUNK)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as f:
            _advise_sequential(f.fileno())
            for off, length, want in rec.blocks:
                value, left = 0, length
                while left:
                    n = f.readinto(view[:min(left, READ_CHUNK)])
                    if not n:
                        return f"{path} ends early at byte {off + length - left}"
                    value = fn(view[:n], value)
                    left -= n
                if value != want:
                    return (f"{path}: checksum mismatch in bytes [{off}, {off + length}) "
                            f"({algorithm} {value:#010x}, manifest {want:#010x})")
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    return None


def verify_step(step_dir: str | os.PathLike[str]) -> list[str]:
    """All problems of one step directory (empty list: valid). Never raises for bad data."""
    step_dir = Path(step_dir)
    try:
        manifest = read_manifest(step_dir)
    except CheckpointError as exc:
        return [str(exc)]
    problems = []
    try:
        checksum.get(manifest.checksum)
    except CheckpointError as exc:
        return [str(exc)]
    for rec in manifest.files:
        problem = verify_file(step_dir / rec.name, rec, manifest.checksum)
        if problem:
            problems.append(problem)
    return problems


def _advise_sequential(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
