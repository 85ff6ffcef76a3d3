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

from hpctrain.checkpoint.fileio import read_into
from hpctrain.checkpoint import checksum
from hpctrain.checkpoint.hashing import read_manifest
from hpctrain.checkpoint.tree import dtype_from_name
from hpctrain.errors import CheckpointCorrupt, CheckpointError

FORMATS = ("torch", "safetensors", "dcp")


def read_tensors(step_dir: str | os.PathLike[str], *, only: str | None = None,
                 verify: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, whole tensor)`` for every tensor of the step in ``step_dir``, one at a time.

    ``only="model"`` keeps the tensors under that top-level key and drops it from the
    names (so they match ``model.state_dict()``). CheckpointCorrupt when a byte does not
    match its checksum or the shards do not cover a tensor."""
    step_dir = Path(step_dir)
    manifest = read_manifest(step_dir)
    if manifest.layout.get("kind") != "torch":
        raise CheckpointError(f"{step_dir} is a {manifest.layout.get('kind')} checkpoint: "
                              "export it with DeepSpeed's own zero_to_fp32.py")
    groups: dict[tuple, list[dict]] = {}
    for e in manifest.tensors:
        path = tuple(e["path"])
        if only is not None and (not path or str(path[0]) != only):
            continue
        groups.setdefault((path, e.get("rank")), []).append(e)
    if only is not None and not groups:
        raise CheckpointError(f"step {manifest.step} has no tensors under {only!r}: choose "
                              f"one of {sorted({str(t['path'][0]) for t in manifest.tensors})}")
    fds: dict[str, int] = {}
    try:
        for (path, rank), entries in groups.items():
            parts = [str(k) for k in (path[1:] if only is not None else path)]
            name = ".".join(parts) + ("" if rank is None else f".rank{rank}")
            yield name, _assemble(step_dir, entries, fds,
                                  checksum.get(manifest.checksum) if verify else None)
    finally:
        for fd in fds.values():
            os.close(fd)


def _assemble(step_dir: Path, entries: list[dict], fds: dict[str, int],
              verify: checksum.Checksum | None) -> torch.Tensor:
    """One whole tensor from its saved boxes (a shard per rank, or one replica);
    ``verify`` is the manifest's checksum function, or None not to check."""
    first = entries[0]
    whole = torch.empty(first["global_shape"], dtype=dtype_from_name(first["dtype"]))
    covered = 0
    for e in entries:
        if e["file"] not in fds:
            fds[e["file"]] = os.open(step_dir / e["file"], os.O_RDONLY)
        buf = torch.empty(e["nbytes"], dtype=torch.uint8)
        try:
            read_into(fds[e["file"]], e["offset"], buf.numpy())
        except (OSError, EOFError) as exc:
            raise CheckpointCorrupt(f"{step_dir / e['file']}: cannot read tensor {e['path']} "
                                    f"({exc})") from None
        if verify is not None and verify(buf.numpy()) != e["crc32"]:
            raise CheckpointCorrupt(f"{step_dir / e['file']}: checksum mismatch in tensor "
                                    f"{e['path']} at bytes [{e['offset']}, "
                                    f"{e['offset'] + e['nbytes']})")
        box = tuple(slice(o, o + n) for o, n in zip(e["offsets"], e["shape"]))
        whole[box] = buf.view(whole.dtype).view(e["shape"])
        covered += math.prod(e["shape"])
    if covered != whole.numel():  # replicated shards of a DTensor overlap: never saved twice
        raise CheckpointCorrupt(f"{step_dir}: the saved shards of tensor {first['path']} "
                                f"cover {covered} of its {whole.numel()} elements")
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
