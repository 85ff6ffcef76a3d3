"""The commit record of one checkpoint: ``manifest.json`` (pure JSON, no torch).

A step directory is a complete checkpoint exactly when it carries a manifest that
parses and validates here; every byte of data is described by a block (offset, length,
crc32) of some file, so ``hpctrain ckpt verify`` can check a checkpoint without torch.

Schema (format_version 1; 2 when some value was saved per rank; 3 when the checksum
is not crc32)::

    {"format": "hpctrain-checkpoint", "format_version": 3, "checksum": "crc32c",
     "step": 1200, "created": 1763700000.0, "world_size": 2,
     "layout": {"kind": "torch"} | {"kind": "deepspeed", "tag": "ds"},
     "versions": {"hpctrain": "0.1.0", "torch": "2.13.0", "python": "3.11.9",
                  "snapshot": "b020c6064c95", "run_id": "0a85..."},   # when the job had them
     "files": [{"name": "rank00000.bin", "size": 4096, "blocks": [[0, 4096, 123]]}],
     "tensors": [{"path": ["model", "w"], "dtype": "float32", "global_shape": [4, 4],
                  "offsets": [0, 0], "shape": [4, 4], "file": "rank00000.bin",
                  "offset": 0, "nbytes": 64, "crc32": 123}],
     "extras": [{"rank": 0, "file": "rank00000.extra.pkl"}]}

Version 2 adds what version-1 readers would silently get wrong, so they refuse it: a
tensor entry with ``"rank": R`` is rank R's own value (the ranks held different bytes at
that path; each wrote its own), and an extras entry's ``"own": [path, ...]`` lists the
extras that differ by rank (never handed to another rank).

Version 3 adds ``"checksum"``: the algorithm of every block's and tensor's checksum
(hpctrain.checkpoint.checksum; the field keeps its historical name ``crc32``). Absent,
it is ``crc32``: a version-1/2 reader would check crc32c values as crc32 and call a
sound checkpoint damaged, so it must refuse them (and does: it reads 1 and 2 only).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from hpctrain.checkpoint.checksum import KNOWN, LEGACY
from hpctrain.errors import CheckpointError

FORMAT = "hpctrain-checkpoint"
FORMAT_VERSION = 3          # the newest this hpctrain writes and reads
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"
LATEST = "latest"
STEP_RE = re.compile(r"^step_(\d{9,})$")


def step_dirname(step: int) -> str:
    """``step_000001200``: zero padded so names sort like numbers."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"step={step!r} is not a non-negative int: pass the training step")
    return f"step_{step:09d}"


def parse_step_dirname(name: str) -> int | None:
    """The step of a committed directory name, or None for anything else (tmp, trash)."""
    m = STEP_RE.match(name)
    return int(m.group(1)) if m else None


@dataclass
class FileRecord:
    """One data file of a checkpoint: its size and crc32 per block covering it."""

    name: str
    size: int
    blocks: list[tuple[int, int, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "blocks": [list(b) for b in self.blocks]}


@dataclass
class Manifest:
    """The parsed commit record; ``raw`` keeps fields this version does not model."""

    step: int
    world_size: int
    files: list[FileRecord]
    tensors: list[dict[str, Any]]
    extras: list[dict[str, Any]]
    layout: dict[str, Any]
    versions: dict[str, str]
    created: float
    checksum: str = LEGACY

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, name: str) -> FileRecord:
        for rec in self.files:
            if rec.name == name:
                return rec
        raise CheckpointError(f"manifest of step {self.step} names no file {name!r}")

    @property
    def per_rank(self) -> bool:
        """Was some value saved per rank (format version 2)?"""
        return any("rank" in t for t in self.tensors) or any(e.get("own") for e in self.extras)

    def to_json(self) -> dict[str, Any]:
        # the lowest version that holds everything: older hpctrain still reads the rest
        version = 3 if self.checksum != LEGACY else 2 if self.per_rank else 1
        head = {"checksum": self.checksum} if version >= 3 else {}
        return {"format": FORMAT, "format_version": version, **head, "step": self.step,
                "created": self.created, "world_size": self.world_size, "layout": self.layout,
                "versions": self.versions, "files": [f.to_json() for f in self.files],
                "tensors": self.tensors, "extras": self.extras}

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise CheckpointError(f"invalid manifest: {what}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_file(rec: Any) -> FileRecord:
    """A file entry as a FileRecord; CheckpointError naming what is wrong. The common case
    (a sound entry) is checked without building any message: a manifest holds a block per
    tensor, and every save reads the previous step's manifest when it prunes."""
    try:
        name, size, blocks = rec["name"], rec["size"], rec["blocks"]
        if type(size) is int and size >= 0 and type(blocks) is list and _safe_name(name):
            pos, out = 0, []
            for b in blocks:
                if type(b) is not list or len(b) != 3:
                    break
                off, length, crc = b
                if not (type(off) is type(length) is type(crc) is int) or off != pos \
                        or length < 0:
                    break
                pos += length
                out.append((off, length, crc))
            else:
                if pos == size:
                    return FileRecord(name, size, out)
    except (KeyError, TypeError):
        pass
    return _explain_file(rec)


def _safe_name(name: Any) -> bool:
    return (isinstance(name, str) and bool(name) and not name.startswith("/")
            and all(part not in ("", ".", "..") for part in name.split("/")))


def _explain_file(rec: Any) -> FileRecord:
    _need(isinstance(rec, dict), f"file entry {rec!r} is not an object")
    name, size, blocks = rec.get("name"), rec.get("size"), rec.get("blocks")
    _need(_safe_name(name),
          f"file name {name!r} must be a relative path inside the step directory")
    _need(_is_int(size) and size >= 0, f"file {name}: size {size!r}")
    _need(isinstance(blocks, list), f"file {name}: blocks {blocks!r}")
    pos, out = 0, []
    for b in blocks:
        _need(isinstance(b, list) and len(b) == 3 and all(_is_int(x) for x in b),
              f"file {name}: block {b!r} is not [offset, length, crc32]")
        # blocks tile the file exactly: no byte escapes verification
        _need(b[0] == pos and b[1] >= 0, f"file {name}: block {b!r} leaves a gap at {pos}")
        pos += b[1]
        out.append((b[0], b[1], b[2]))
    _need(pos == size, f"file {name}: blocks cover {pos} bytes of {size}")
    return FileRecord(name, size, out)


_TENSOR_LISTS = ("path", "global_shape", "offsets", "shape")
_TENSOR_INTS = ("offset", "nbytes", "crc32")


def _check_tensor(t: Any, names: set[str]) -> None:
    """CheckpointError naming what is wrong with a tensor entry; the sound case is checked
    without building a message (as in :func:`_check_file`)."""
    try:
        if (all(type(t[k]) is list for k in _TENSOR_LISTS)
                and len(t["offsets"]) == len(t["shape"]) == len(t["global_shape"])
                and t["file"] in names and all(type(t[k]) is int for k in _TENSOR_INTS)
                and type(t["dtype"]) is str
                and ("rank" not in t or (type(t["rank"]) is int and t["rank"] >= 0))):
            return
    except (KeyError, TypeError):
        pass
    _explain_tensor(t, names)


def _explain_tensor(t: Any, names: set[str]) -> None:
    _need(isinstance(t, dict), f"tensor entry {t!r}")
    for key in ("path", "global_shape", "offsets", "shape"):
        _need(isinstance(t.get(key), list), f"tensor {t.get('path')}: {key}")
    _need(len(t["offsets"]) == len(t["shape"]) == len(t["global_shape"]),
          f"tensor {t['path']}: offsets/shape/global_shape ranks differ")
    _need(t.get("file") in names, f"tensor {t['path']}: unknown file {t.get('file')!r}")
    for key in ("offset", "nbytes", "crc32"):
        _need(_is_int(t.get(key)), f"tensor {t['path']}: {key}")
    _need(isinstance(t.get("dtype"), str), f"tensor {t['path']}: dtype")
    _need("rank" not in t or (_is_int(t["rank"]) and t["rank"] >= 0),
          f"tensor {t['path']}: rank {t.get('rank')!r}")


def parse(data: bytes | str, where: str = "manifest") -> Manifest:
    """Parse and validate manifest bytes; CheckpointError names what is wrong."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{where} is not valid JSON ({exc}): the checkpoint is "
                              "incomplete or damaged; delete it or restore it") from None
    try:
        _need(isinstance(raw, dict) and raw.get("format") == FORMAT,
              f"format is {raw.get('format') if isinstance(raw, dict) else raw!r}, not {FORMAT}")
        _need(raw.get("format_version") in READABLE_VERSIONS,
              f"format_version {raw.get('format_version')!r} (this hpctrain reads "
              f"{' and '.join(map(str, READABLE_VERSIONS))}; upgrade hpctrain)")
        _need(_is_int(raw.get("step")) and raw["step"] >= 0, f"step {raw.get('step')!r}")
        _need(_is_int(raw.get("world_size")) and raw["world_size"] >= 1,
              f"world_size {raw.get('world_size')!r}")
        files = [_check_file(f) for f in raw.get("files", [])]
        names = {f.name for f in files}
        _need(len(names) == len(files), "duplicate file names")
        tensors, extras = raw.get("tensors", []), raw.get("extras", [])
        _need(isinstance(tensors, list) and isinstance(extras, list), "tensors/extras lists")
        for t in tensors:
            _check_tensor(t, names)
        for e in extras:
            _need(isinstance(e, dict) and e.get("file") in names and _is_int(e.get("rank"))
                  and all(isinstance(p, list) for p in e.get("own", [])),
                  f"extras entry {e!r}")
        layout = raw.get("layout", {})
        _need(isinstance(layout, dict) and isinstance(layout.get("kind"), str), "layout.kind")
        checksum = raw.get("checksum", LEGACY)
        _need(checksum in KNOWN, f"checksum {checksum!r} (this hpctrain knows "
              f"{', '.join(KNOWN)}; upgrade hpctrain)")
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    return Manifest(step=raw["step"], world_size=raw["world_size"], files=files,
                    tensors=tensors, extras=extras, layout=layout,
                    versions=dict(raw.get("versions", {})), created=float(raw.get("created", 0)),
                    checksum=checksum)
