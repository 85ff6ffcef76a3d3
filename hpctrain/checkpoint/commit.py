"""Rank 0's part of a save: the manifest made from every rank's records (format 5: the head
in ``manifest.json``, each rank's record in ``manifest.ranks``), and the renames that
commit the step (steps 2 of the protocol in :mod:`hpctrain.checkpoint.manager`; see
docs/checkpoint.md for what is durable when).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from hpctrain import protocol
from hpctrain.checkpoint import catalog, checksum, ranksfile, storage
from hpctrain.checkpoint.checksum import LEGACY
from hpctrain.checkpoint.manifest import (MANIFEST, RANKS, Manifest, RankRecords, own_paths,
                                          per_rank_paths, step_dirname)
from hpctrain.errors import CheckpointError


def manifest_of(step: int, world: int, layout: dict, records: list[RankRecords],
                foreign: RankRecords | None = None) -> Manifest:
    """The manifest of ``step`` from every rank's records (index: rank) and the files rank 0
    summed for the others (``foreign``: a DeepSpeed step's); CheckpointError when they
    summed with different algorithms (one manifest names one)."""
    every = records + ([foreign] if foreign is not None else [])
    algorithms = sorted({r.checksum for r in every if r.files}) or [LEGACY]
    if len(algorithms) > 1:  # a node without the crc32c package's hardware path
        raise CheckpointError(f"step {step} was not saved: its ranks wrote checksums "
                              f"with {' and '.join(algorithms)}: install the same "
                              "hpctrain (and crc32c) on every node")
    tensors = [t for r in records for t in r.tensors]
    extras = [e for r in records for e in r.extras]
    return Manifest(
        step=step, world_size=world, layout=layout, created=time.time(),
        files=[f for r in every for f in r.files], tensors=tensors, extras=extras,
        versions=versions(), checksum=algorithms[0], per_rank=per_rank_paths(tensors),
        own=own_paths(extras), parts=records)


def manifest_files(manifest: Manifest) -> dict[str, bytes]:
    """The files of ``manifest`` (format 5), in the order they are written: every rank's
    record (``manifest.ranks``), then the head that names it (``manifest.json``, which
    makes the step complete). Sets ``manifest.ranks``."""
    assert manifest.parts is not None
    fn = checksum.get(manifest.checksum)
    ranks = ranksfile.encode([json.dumps(p.to_json(), separators=(",", ":")).encode()
                              for p in manifest.parts], fn)
    manifest.ranks = ranksfile.file_record(ranks, fn)
    return {RANKS: ranks, MANIFEST: manifest.dumps()}


def publish(root: Path, tmp: Path, manifest: Manifest, dir_mode: int, file_mode: int) -> None:
    """Write ``manifest`` into the written temporary directory ``tmp``, rename it to its
    step's name (the commit) and point ``latest`` at it, each durable before the next."""
    step = manifest.step
    final = root / step_dirname(step)
    try:
        for name, data in manifest_files(manifest).items():   # the records before the head
            storage.atomic_write(tmp / name, data)
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
