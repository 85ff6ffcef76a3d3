"""Checkpoints out to standard tools: whole tensors, reassembled from the shards of any
world size, as ``torch.load``, safetensors or ``torch.distributed.checkpoint`` files.

Reads only the manifest and the tensor files (every byte checked against its checksum);
unpickles nothing, so it is safe on a checkpoint somebody else wrote. Extras (pickled
Python values) are not exported. Names are the state's key path joined by dots
(``model.layers.0.weight``); a value saved per rank (:mod:`hpctrain.checkpoint.replicas`)
gets ``.rank<R>`` appended, one tensor per rank.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from hpctrain.checkpoint.manifest import TensorEntry
from hpctrain.checkpoint.reader import StepReader
from hpctrain.checkpoint.tree import dtype_from_name
from hpctrain.errors import CheckpointCorrupt, CheckpointError

FORMATS = ("torch", "safetensors", "dcp")


def read_tensors(step_dir: str | os.PathLike[str], *, only: str | None = None,
                 verify: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, whole tensor)`` for every tensor of the step in ``step_dir``, one at a time.

    ``only="model"`` keeps the tensors under that top-level key and drops it from the
    names (so they match ``model.state_dict()``). CheckpointCorrupt when a byte does not
    match its checksum or the shards do not cover a tensor."""
    reader = StepReader(step_dir, verify=verify, overlap=False)
    manifest = reader.manifest
    if manifest.kind != "torch":
        raise CheckpointError(f"{step_dir} is a {manifest.kind} checkpoint: "
                              "export it with DeepSpeed's own zero_to_fp32.py")
    groups: dict[tuple, list[TensorEntry]] = {}
    for e in manifest.tensors:
        path = tuple(e.path)
        if only is not None and (not path or str(path[0]) != only):
            continue
        groups.setdefault((path, e.rank), []).append(e)
    if only is not None and not groups:
        raise CheckpointError(f"step {manifest.step} has no tensors under {only!r}: choose "
                              f"one of {sorted({str(t.path[0]) for t in manifest.tensors})}")
    with reader:
        for (path, rank), entries in groups.items():
            parts = [str(k) for k in (path[1:] if only is not None else path)]
            name = ".".join(parts) + ("" if rank is None else f".rank{rank}")
            yield name, _assemble(reader, entries)


def _assemble(reader: StepReader, entries: list[TensorEntry]) -> torch.Tensor:
    """One whole tensor from its saved boxes (a shard per rank, or one replica), every
    byte checked (when the reader verifies) as it is read."""
    first = entries[0]
    whole = torch.empty(first.global_shape, dtype=dtype_from_name(first.dtype))
    covered = 0
    for e in entries:
        buf = torch.empty(e.nbytes, dtype=torch.uint8)
        reader.read(e, buf.numpy())
        box = tuple(slice(o, o + n) for o, n in zip(e.offsets, e.shape))
        whole[box] = buf.view(whole.dtype).view(e.shape)
        covered += math.prod(e.shape)
    if covered != whole.numel():  # replicated shards of a DTensor overlap: never saved twice
        raise CheckpointCorrupt(f"{reader.step_dir}: the saved shards of tensor "
                                f"{first.path} cover {covered} of its {whole.numel()} "
                                "elements")
    return whole


def export(step_dir: str | os.PathLike[str], fmt: str, out: str | os.PathLike[str], *,
           only: str | None = None, verify: bool = True) -> int:
    """Write the step's tensors to ``out`` as ``fmt`` (torch, safetensors or dcp); the
    number of tensors written. The whole state is held in memory once."""
    if fmt not in FORMATS:
        raise CheckpointError(f"unknown export format {fmt!r}: choose one of {list(FORMATS)}")
    tensors = dict(read_tensors(step_dir, only=only, verify=verify))
    out = Path(out)
    if out.exists() and (fmt != "dcp" or any(out.iterdir())):
        raise CheckpointError(f"{out} exists: choose a new path (nothing is overwritten)")
    if fmt == "torch":
        torch.save(tensors, out)
    elif fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(tensors, str(out), metadata={"format": "pt", "source": str(step_dir)})
    else:
        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():  # "assuming ... a single process": it is, on purpose
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(tensors, checkpoint_id=str(out))
    return len(tensors)
