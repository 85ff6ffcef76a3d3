"""Where a submission came from, written beside its rendered script.

Every submission, snapshot or not, leaves in the job folder ``<job id>_provenance.json``
(git commit, branch, dirty, the snapshot id, Python, hpctrain, torch and CUDA versions,
the host), ``<job id>_requirements.txt`` (the installed distributions, as ``pip freeze``
prints them) and ``<job id>_git.diff`` (the uncommitted changes, when there are any).
No torch import and no pip run: both read the installed metadata.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctrain import __version__, access
from hpctrain.files import atomic_write
from hpctrain.jobs.snapshot import Source, git_facts

def environment_facts() -> dict[str, Any]:
    """This interpreter's facts: Python, the host, hpctrain's, torch's and CUDA's versions
    (torch's from its metadata and version file: importing it would cost seconds)."""
    torch_version, cuda = _torch_versions()
    return {"python": platform.python_version(), "executable": sys.executable,
            "host": socket.gethostname(), "platform": platform.platform(terse=True),
            "hpctrain": __version__, "torch": torch_version, "cuda": cuda}


def _torch_versions() -> tuple[str, str]:
    from importlib import metadata, util
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "", ""
    spec = util.find_spec("torch")
    cuda = ""
    for location in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = (Path(location) / "version.py").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("cuda"):   # cuda: Optional[str] = '12.1' (None on CPU builds)
                cuda = line.split("=", 1)[1].strip().strip("'\"")
        break
    return version, "" if cuda == "None" else cuda


def requirements() -> str:
    """The installed distributions as ``name==version`` lines, sorted: ``pip freeze``'s
    content without running pip (which takes a second)."""
    from importlib import metadata
    seen = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name")
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return "".join(line + "\n" for _, line in sorted(seen.items()))


@dataclass(frozen=True)
class Provenance:
    """What a job folder records about one submission (``<job id>_provenance.json``)."""

    snapshot_id: str
    snapshot_dir: str
    source_dir: str
    git: dict[str, Any]
    environment: dict[str, Any]
    submitted_from: str = ""         # user@host:path of a --host submission
    submitted_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["git"] = {k: v for k, v in self.git.items() if k not in ("diff", "files")}
        return data


def provenance(source: Source | None, snapshot_dir: Path | None, *,
               source_dir: str = "", git: dict[str, Any] | None = None,
               submitted_from: str = "") -> Provenance:
    """The provenance of a submission from ``source`` (None: no snapshot; the git facts of
    ``source_dir`` are still recorded)."""
    facts = dict(git if git is not None else (source.git if source else {}))
    if git is None and source is None and source_dir:
        facts = git_facts(Path(source_dir))
    facts.pop("files", None)
    return Provenance(snapshot_id=source.id if source else "",
                      snapshot_dir=str(snapshot_dir or ""),
                      source_dir=source.root if source else source_dir, git=facts,
                      environment=environment_facts(), submitted_from=submitted_from)


def write_provenance(folder: str | os.PathLike[str], key: str, prov: Provenance,
                     access_level: str) -> list[Path]:
    """Write ``<key>_provenance.json``, ``<key>_requirements.txt`` and (when git has
    uncommitted changes) ``<key>_git.diff`` into the job folder; the paths written."""
    mode = access.modes(access_level).file
    folder = Path(folder)
    out = [folder / f"{key}_provenance.json", folder / f"{key}_requirements.txt"]
    atomic_write(out[0], json.dumps(prov.to_json(), indent=1, sort_keys=True) + "\n", mode=mode)
    atomic_write(out[1], requirements(), mode=mode)
    if prov.git.get("diff"):
        out.append(folder / f"{key}_git.diff")
        atomic_write(out[2], prov.git["diff"], mode=mode)
    return out
