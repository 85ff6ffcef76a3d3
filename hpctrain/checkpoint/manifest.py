"""The commit record of one checkpoint, ``manifest.json``, and its typed entries (pure
JSON, no torch). This is the one module that knows the manifest's keys.

A step directory is a complete checkpoint exactly when it carries a manifest that
parses and validates here; every byte of data is described by a block (offset, length,
sum) of some file, so ``hpctrain ckpt verify`` can check a checkpoint without torch.

Schema (format_version 5, what this hpctrain writes): ``manifest.json`` (the head) holds what
every rank needs, ``manifest.ranks`` (:mod:`~hpctrain.checkpoint.ranksfile`) each rank's
record, so that a loading rank reads the head and its own record::

    {"format": "hpctrain-checkpoint", "format_version": 5, "checksum": "crc32c",
     "step": 1200, "created": 1763700000.0, "world_size": 2,
     "layout": {"kind": "torch", "tp": 1, "dp": 2, "pp": 1} | {"kind": "deepspeed", "tag": "ds"},
     "versions": {"hpctrain": "0.1.0", "torch": "2.13.0", "python": "3.11.9",
                  "snapshot": "b020c6064c95", "run_id": "0a85..."},   # when the job had them
     "files": [],                  # files no rank recorded (DeepSpeed's: rank 0 summed them)
     "tensors": [{"path": ["model", "w"], "dtype": "float32", "global_shape": [4, 4],
                  "offsets": [0, 0], "shape": [4, 4], "sharded": false,
                  "file": "rank00000.bin", "offset": 0, "nbytes": 64, "sum": 123}],
                                   # the shared entries (no "rank")
     "per_rank": [["rng"]],        # paths of the tensors saved per rank
     "own": [["extra", "seed"]],   # paths of the extras that differ by rank
     "ranks": {"name": "manifest.ranks", "size": 812, "blocks": [[0, 812, 456]]}}

    rank 0's record: {"files": [{"name": "rank00000.bin", "size": 4096,
                                 "blocks": [[0, 4096, 123]]}, ...],
                      "tensors": [...],   # its per-rank entries, each with "rank": 0
                      "extras": [{"rank": 0, "file": "rank00000.extra.pkl", "own": [...]}]}

Every block's third number and every tensor's ``sum`` is a checksum of the algorithm
``checksum`` names (:mod:`hpctrain.checkpoint.checksum`). Older versions, all still read:

* 1: no ``checksum`` field (crc32), the tensor's sum under the key ``crc32``;
* 2 adds what version-1 readers would silently get wrong, so they refuse it: a tensor
  entry with ``"rank": R`` is rank R's own value (the ranks held different bytes at that
  path; each wrote its own), and an extras entry's ``"own": [path, ...]`` lists the
  extras that differ by rank (never handed to another rank);
* 3 adds ``"checksum"`` (absent: crc32): a version-1/2 reader would check crc32c values
  as crc32 and call a sound checkpoint damaged, so it must refuse them;
* 4 names the tensor's sum ``sum`` (CRC-32C was under ``crc32`` in 3); 1 to 4 keep every
  rank's entries (``files``, ``tensors``, ``extras``) in ``manifest.json``;
* 5 moves each rank's into its record in ``manifest.ranks`` and adds ``per_rank``, ``own``
  and ``ranks`` to the head: a version-4 reader would find no rank's files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hpctrain.checkpoint.checksum import KNOWN, LEGACY
from hpctrain.errors import CheckpointError
# the root's layout (step directories, `latest`), shared with the login side
from hpctrain.protocol.ckptlayout import (LATEST, STEP_RE, parse_step_dirname,  # noqa: F401
                                         step_dirname)

FORMAT = "hpctrain-checkpoint"
VERSION = 5                         # what this hpctrain writes, whatever the step holds
READABLE_VERSIONS = (1, 2, 3, 4, 5)
_SUM_KEY = {1: "crc32", 2: "crc32", 3: "crc32", 4: "sum", 5: "sum"}  # a tensor's sum key
MANIFEST = "manifest.json"
RANKS = "manifest.ranks"            # version 5: every rank's record

Block = tuple[int, int, int]        # (offset, length, sum) of a file's bytes


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise CheckpointError(f"invalid manifest: {what}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _safe_name(name: Any) -> bool:
    return (isinstance(name, str) and bool(name) and not name.startswith("/")
            and all(part not in ("", ".", "..") for part in name.split("/")))


@dataclass
class FileRecord:
    """One data file of a checkpoint: its size and the blocks that tile it."""

    name: str
    size: int
    blocks: list[Block] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "blocks": [list(b) for b in self.blocks]}

    @classmethod
    def from_json(cls, rec: Any) -> FileRecord:
        """A validated record; CheckpointError naming what is wrong. The sound case is
        checked without building any message: a manifest holds a block per tensor, and
        every save reads the previous steps' manifests when it prunes."""
        try:
            name, size, blocks = rec["name"], rec["size"], rec["blocks"]
            if type(size) is int and size >= 0 and type(blocks) is list and _safe_name(name):
                pos, out = 0, []
                for b in blocks:
                    if type(b) is not list or len(b) != 3:
                        break
                    off, length, total = b
                    if not (type(off) is type(length) is type(total) is int) or off != pos \
                            or length < 0:
                        break
                    pos += length
                    out.append((off, length, total))
                else:
                    if pos == size:
                        return cls(name, size, out)
        except (KeyError, TypeError):
            pass
        return cls._explain(rec)

    @classmethod
    def _explain(cls, rec: Any) -> FileRecord:
        _need(isinstance(rec, dict), f"file entry {rec!r} is not an object")
        name, size, blocks = rec.get("name"), rec.get("size"), rec.get("blocks")
        _need(_safe_name(name),
              f"file name {name!r} must be a relative path inside the step directory")
        _need(_is_int(size) and size >= 0, f"file {name}: size {size!r}")
        _need(isinstance(blocks, list), f"file {name}: blocks {blocks!r}")
        pos, out = 0, []
        for b in blocks:
            _need(isinstance(b, list) and len(b) == 3 and all(_is_int(x) for x in b),
                  f"file {name}: block {b!r} is not [offset, length, sum]")
            # blocks tile the file exactly: no byte escapes verification
            _need(b[0] == pos and b[1] >= 0, f"file {name}: block {b!r} leaves a gap at {pos}")
            pos += b[1]
            out.append((b[0], b[1], b[2]))
        _need(pos == size, f"file {name}: blocks cover {pos} bytes of {size}")
        return cls(name, size, out)


@dataclass
class TensorEntry:
    """One saved box of a tensor (a DTensor shard, or a whole plain tensor): where in the
    global tensor, where its bytes are, and their sum.

    The sequences are JSON's lists, kept as the manifest holds them: a large sharded
    state has an entry per shard per rank, and rank 0 writes them all and every prune
    parses them all again, so they are neither converted nor copied."""

    path: list                      # the key path in the state
    dtype: str                      # torch's name without "torch."
    global_shape: list[int]
    offsets: list[int]              # the box's corner in the global tensor
    shape: list[int]                # the box's shape
    sharded: bool                   # a DTensor's shard (else a plain tensor)
    file: str
    offset: int                     # in ``file``
    nbytes: int
    sum: int
    rank: int | None = None         # set when this is one rank's own value (version 2)

    def to_json(self) -> dict[str, Any]:
        out = {"path": self.path, "dtype": self.dtype, "global_shape": self.global_shape,
               "offsets": self.offsets, "shape": self.shape, "sharded": self.sharded,
               "file": self.file, "offset": self.offset, "nbytes": self.nbytes, "sum": self.sum}
        if self.rank is not None:
            out["rank"] = self.rank
        return out

    @classmethod
    def from_json(cls, t: Any, sum_key: str = "sum") -> TensorEntry:
        """A validated entry (its sum under ``sum_key``, by format version); CheckpointError
        naming what is wrong. The sound case builds no message (as in FileRecord)."""
        try:
            path, gshape, offsets, shape = t["path"], t["global_shape"], t["offsets"], t["shape"]
            offset, nbytes, total, dtype, name = (t["offset"], t["nbytes"], t[sum_key],
                                                  t["dtype"], t["file"])
            rank = t["rank"] if "rank" in t else None
            if (type(path) is type(gshape) is type(offsets) is type(shape) is list
                    and len(offsets) == len(shape) == len(gshape)
                    and type(offset) is type(nbytes) is type(total) is int
                    and type(dtype) is str and type(name) is str
                    and ("rank" not in t or (type(rank) is int and rank >= 0))):
                return cls(path, dtype, gshape, offsets, shape, t.get("sharded", False), name,
                           offset, nbytes, total, rank)
        except (KeyError, TypeError):
            pass
        cls._explain(t, sum_key)
        raise CheckpointError(f"invalid manifest: tensor entry {t!r}")

    @staticmethod
    def _explain(t: Any, sum_key: str) -> None:
        _need(isinstance(t, dict), f"tensor entry {t!r}")
        for key in ("path", "global_shape", "offsets", "shape"):
            _need(isinstance(t.get(key), list), f"tensor {t.get('path')}: {key}")
        _need(len(t["offsets"]) == len(t["shape"]) == len(t["global_shape"]),
              f"tensor {t['path']}: offsets/shape/global_shape ranks differ")
        _need(isinstance(t.get("file"), str), f"tensor {t['path']}: file {t.get('file')!r}")
        for key in ("offset", "nbytes", sum_key):
            _need(_is_int(t.get(key)), f"tensor {t['path']}: {key}")
        _need(isinstance(t.get("dtype"), str), f"tensor {t['path']}: dtype")
        _need("rank" not in t or (_is_int(t["rank"]) and t["rank"] >= 0),
              f"tensor {t['path']}: rank {t.get('rank')!r}")


@dataclass
class ExtrasEntry:
    """One rank's extras file; ``own`` lists the key paths of the extras that differ by
    rank (version 2)."""

    rank: int
    file: str
    own: list[list] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": self.rank, "file": self.file}
        if self.own:
            out["own"] = self.own
        return out

    @classmethod
    def from_json(cls, e: Any) -> ExtrasEntry:
        """A validated entry; CheckpointError naming it when it is not one."""
        try:
            own = e.get("own", [])
            if (_is_int(e.get("rank")) and isinstance(e.get("file"), str)
                    and isinstance(own, list) and all(isinstance(p, list) for p in own)):
                return cls(e["rank"], e["file"], own)
        except (AttributeError, TypeError):
            pass
        raise CheckpointError(f"invalid manifest: extras entry {e!r}")


@dataclass
class RankRecords:
    """What one rank's write adds to the manifest (the commit gathers one per rank):
    its files, tensor entries and extras entries; ``checksum`` names the algorithm of
    every sum in them. Version 5 keeps it as the rank's record (:meth:`to_json`)."""

    files: list[FileRecord] = field(default_factory=list)
    tensors: list[TensorEntry] = field(default_factory=list)
    extras: list[ExtrasEntry] = field(default_factory=list)
    checksum: str = LEGACY

    def to_json(self) -> dict[str, Any]:
        return {"files": [f.to_json() for f in self.files],
                "tensors": [t.to_json() for t in self.tensors if t.rank is not None],
                "extras": [e.to_json() for e in self.extras]}


@dataclass
class Manifest:
    """The parsed commit record: every rank's entries (``reader.read_manifest``), or one
    rank's view of them (``reader.read_rank_view``: the head's and that rank's record's)."""

    step: int
    world_size: int
    files: list[FileRecord]
    tensors: list[TensorEntry]
    extras: list[ExtrasEntry]
    layout: dict[str, Any]
    versions: dict[str, str]
    created: float
    checksum: str = LEGACY
    per_rank: list[list] = field(default_factory=list)   # tensor paths saved per rank
    own: list[list] = field(default_factory=list)        # extras' paths that differ by rank
    ranks: FileRecord | None = None                      # version 5: manifest.ranks
    parts: list[RankRecords] | None = None               # version 5: each rank's record

    @property
    def kind(self) -> str:
        """What wrote the step: "torch" (the manager's own files) or "deepspeed"."""
        return self.layout["kind"]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, name: str) -> FileRecord:
        for rec in self.files:
            if rec.name == name:
                return rec
        raise CheckpointError(f"manifest of step {self.step} names no file {name!r}")

    def to_json(self) -> dict[str, Any]:
        """The head (version 5): all but the ranks' records (``parts``), and ``ranks``."""
        assert self.ranks is not None and self.parts is not None
        recorded = {f.name for part in self.parts for f in part.files}
        return {"format": FORMAT, "format_version": VERSION, "checksum": self.checksum,
                "step": self.step, "created": self.created, "world_size": self.world_size,
                "layout": self.layout, "versions": self.versions,
                "files": [f.to_json() for f in self.files if f.name not in recorded],
                "tensors": [t.to_json() for t in self.tensors if t.rank is None],
                "per_rank": self.per_rank, "own": self.own, "ranks": self.ranks.to_json()}

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()


def parse(data: bytes | str, where: str = "manifest") -> Manifest:
    """Parse and validate manifest bytes of any readable version (of version 5: the head,
    ``ranks`` set, no rank's record); CheckpointError names what is wrong."""
    raw = _json(data, where)
    try:
        return _manifest(raw)
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc}") from None


def parse_part(data: bytes, rank: int, where: str) -> RankRecords:
    """One rank's record of ``manifest.ranks`` (version 5), validated."""
    raw = _json(data, where)
    try:
        _need(isinstance(raw, dict) and all(isinstance(raw.get(k), list)
                                            for k in ("files", "tensors", "extras")),
              "a rank's record must hold files, tensors and extras lists")
        part = RankRecords([FileRecord.from_json(f) for f in raw["files"]],
                           [TensorEntry.from_json(t) for t in raw["tensors"]],
                           [ExtrasEntry.from_json(e) for e in raw["extras"]])
        names = {f.name for f in part.files}
        for t in part.tensors:
            _need(t.rank == rank and t.file in names, f"rank {rank}'s tensor {t.path}: rank "
                  f"{t.rank!r}, file {t.file!r}")
        for e in part.extras:
            _need(e.rank == rank and e.file in names, f"rank {rank}'s extras entry {e.file!r}")
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    return part


def _json(data: bytes | str, where: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{where} is not valid JSON ({exc}): the checkpoint is "
                              "incomplete or damaged; delete it or restore it") from None


def _manifest(raw: Any) -> Manifest:
    _need(isinstance(raw, dict) and raw.get("format") == FORMAT,
          f"format is {raw.get('format') if isinstance(raw, dict) else raw!r}, not {FORMAT}")
    version = raw.get("format_version")
    _need(version in READABLE_VERSIONS,
          f"format_version {version!r} (this hpctrain reads "
          f"{' and '.join(map(str, READABLE_VERSIONS))}; upgrade hpctrain)")
    _need(_is_int(raw.get("step")) and raw["step"] >= 0, f"step {raw.get('step')!r}")
    _need(_is_int(raw.get("world_size")) and raw["world_size"] >= 1,
          f"world_size {raw.get('world_size')!r}")
    files = [FileRecord.from_json(f) for f in raw.get("files", [])]
    names = {f.name for f in files}
    _need(len(names) == len(files), "duplicate file names")
    tensors, extras = raw.get("tensors", []), raw.get("extras", [])
    _need(isinstance(tensors, list) and isinstance(extras, list), "tensors/extras lists")
    sum_key = _SUM_KEY[version]
    tensors = [TensorEntry.from_json(t, sum_key) for t in tensors]
    extras = [ExtrasEntry.from_json(e) for e in extras]
    ranks = FileRecord.from_json(raw.get("ranks")) if version >= 5 else None
    if ranks is None:  # one file holds every entry: every tensor's file is listed here
        for t in tensors:
            _need(t.file in names, f"tensor {t.path}: unknown file {t.file!r}")
    for e in extras:
        _need(e.file in names, f"extras entry {e.to_json()!r}: unknown file")
    per_rank, own = raw.get("per_rank"), raw.get("own")
    if ranks is None:
        per_rank, own = per_rank_paths(tensors), own_paths(extras)
    _need(isinstance(per_rank, list) and isinstance(own, list)
          and all(isinstance(p, list) for p in per_rank + own), "per_rank/own lists")
    layout = raw.get("layout", {})
    _need(isinstance(layout, dict) and isinstance(layout.get("kind"), str), "layout.kind")
    checksum = raw.get("checksum", LEGACY)
    _need(checksum in KNOWN, f"checksum {checksum!r} (this hpctrain knows "
          f"{', '.join(KNOWN)}; upgrade hpctrain)")
    return Manifest(step=raw["step"], world_size=raw["world_size"], files=files,
                    tensors=tensors, extras=extras, layout=layout,
                    versions=dict(raw.get("versions", {})), created=float(raw.get("created", 0)),
                    checksum=checksum, per_rank=per_rank, own=own, ranks=ranks)


def per_rank_paths(tensors: list[TensorEntry]) -> list[list]:
    """The paths of the tensors saved per rank, each once, sorted."""
    return sorted({tuple(t.path): t.path for t in tensors if t.rank is not None}.values(),
                  key=repr)


def own_paths(extras: list[ExtrasEntry]) -> list[list]:
    """The paths of the extras that differ by rank (any entry's), each once, sorted."""
    return sorted({tuple(p): p for e in extras for p in e.own}.values(), key=repr)
