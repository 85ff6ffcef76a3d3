"""Rank 0's part of a save: the manifest made from every rank's records, and the renames
that commit the step (steps 2 of the protocol in :mod:`hpctrain.checkpoint.manager`; see
docs/checkpoint.md for what is durable when).
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from hpctrain import protocol
from hpctrain.checkpoint import catalog, storage
from hpctrain.checkpoint.checksum import LEGACY
from hpctrain.checkpoint.manifest import MANIFEST, Manifest, RankRecords, step_dirname
from hpctrain.errors import CheckpointError


def manifest_of(step: int, world: int, layout: dict, records: list[RankRecords]) -> Manifest:
    """The manifest of ``step`` from every rank's records; CheckpointError when the ranks
    summed with different algorithms (one manifest names one)."""
    algorithms = sorted({r.checksum for r in records if r.files}) or [LEGACY]
    if len(algorithms) > 1:  # a node without the crc32c package's hardware path
        raise CheckpointError(f"step {step} was not saved: its ranks wrote checksums "
                              f"with {' and '.join(algorithms)}: install the same "
                              "hpctrain (and crc32c) on every node")
    return Manifest(
        step=step, world_size=world, layout=layout, created=time.time(),
        files=[f for r in records for f in r.files],
        tensors=[t for r in records for t in r.tensors],
        extras=[e for r in records for e in r.extras],
        versions=versions(), checksum=algorithms[0])


def publish(root: Path, tmp: Path, manifest: Manifest, dir_mode: int, file_mode: int) -> None:
    """Write ``manifest`` into the written temporary directory ``tmp``, rename it to its
    step's name (the commit) and point ``latest`` at it, each durable before the next."""
    step = manifest.step
    final = root / step_dirname(step)
    try:
        storage.atomic_write(tmp / MANIFEST, manifest.dumps())
        storage.apply_modes(tmp, dir_mode, file_mode)
        storage.fault("before-dir-fsync")
        storage.fsync_path(tmp)
        storage.fault("before-rename")
        # re-saving a step (e.g. right after a resume): the old one is moved aside, not
        # deleted, until the new one is in place; a crash in between leaves it to be
        # put back at the next start (storage.clean_leftovers)
        old = storage.set_aside(root, final.name) if final.exists() else None
        storage.fault("resave-after-aside")
        os.rename(tmp, final)  # the commit
        storage.fault("after-rename")
        storage.fsync_path(root)
        if old is not None:
            storage.remove_tree(old)
        storage.fault("before-latest")
        catalog.write_latest(root, step, file_mode)
        storage.fault("after-latest")
    except OSError as exc:
        raise storage.io_error(f"commit step {step} in {root}", exc) from None


def versions() -> dict[str, str]:
    """What wrote the step: hpctrain, torch and python, and the job's code and run."""
    import torch

    import hpctrain

    found = {"hpctrain": hpctrain.__version__, "torch": torch.__version__,
             "python": platform.python_version()}
    # the code that wrote it (the job's snapshot) and the run it belongs to, when known:
    # a resumed run can tell whether it runs the code that saved (docs/checkpoint.md)
    for key, name in (("snapshot", protocol.SNAPSHOT_ID), ("run_id", protocol.RUN_ID)):
        if os.environ.get(name):
            found[key] = os.environ[name]
    return found
