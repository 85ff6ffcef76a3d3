"""A partition's facts on the login node: the site's files over Slurm's own word.

A partition no facts file names takes its facts from Slurm (``scontrol show partition``
and its nodes); a file that leaves out a node fact is laid over Slurm's; a complete file
needs no word from Slurm. Slurm's word is kept briefly (:data:`CACHE_S`) in the user's cache,
so ten submits in a row ask the controller once; within one process (a sweep of 1000
points) it is asked once. A partition Slurm did not know is asked again next time: a
sysadmin may have just created it.

The devcluster's partitions (``templates/devcluster/``) are on the search path only where
the active Slurm is the devcluster, or where this machine has no Slurm at all (rendering on
a laptop): never beside a real site's partitions.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from hpctrain.errors import HpctrainError, PartitionError, SlurmError
from hpctrain.files import atomic_write
from hpctrain.slurm import client
from hpctrain.slurm import partitions as slurm_partitions
from hpctrain.spec import slurmfacts
from hpctrain.spec.partitions import Partition, find_partition, needs_slurm, partition_names

CACHE_S = 300.0
_WORD: dict[tuple[str, str], tuple[float, Any]] = {}    # this process's answers


@dataclass(frozen=True)
class Site:
    """The template search path as this machine sees it."""

    dirs: tuple[Path, ...]      # the site's directories, then the built-in one (no devcluster)
    devcluster: bool            # the devcluster's partitions are on the path too

    def search(self) -> list[Path]:
        from hpctrain.render.script import resolve_dirs
        return resolve_dirs(self.dirs, self.devcluster)

    def partition(self, name: str) -> Partition:
        """The facts of ``name``: its file, over Slurm's word where the file needs it."""
        search = self.search()
        if not needs_slurm(name, search):
            return find_partition(name, search)
        try:
            word = slurm_word(name)
        except SlurmError as exc:
            raise PartitionError(_unknown(name, search, f"Slurm could not be asked: {exc}")) \
                from None
        if word is None:
            raise PartitionError(_unknown(name, search, "Slurm has no partition of that name "
                                          "(`sinfo -s` lists them)"))
        return find_partition(name, search, slurm=slurmfacts.facts(*word))

    def partitions(self) -> list[tuple[Partition, str]]:
        """Every partition of the facts files and of Slurm: (facts, where they come from).
        A facts file that cannot be read is an error; a partition only Slurm knows and
        cannot describe (no nodes) is left out."""
        search = self.search()
        found = {name: self.partition(name) for name in partition_names(search)}
        for name in slurm_names():
            if name not in found:
                try:
                    found[name] = self.partition(name)
                except HpctrainError:
                    continue
        return [(p, p.source) for _, p in sorted(found.items())]


def render_here(spec: Any, dirs: Iterable[Path], **options: Any) -> Any:
    """Render ``spec`` (hpctrain.render.script.render, which ``options`` go to) with its
    partition's facts as this machine finds them; ``dirs`` as template_dirs() gives them."""
    from hpctrain.render.script import render

    here = site(dirs)
    return render(spec, template_dirs=here.dirs, partition=here.partition(spec.partition),
                  devcluster=here.devcluster, **options)


def site(dirs: Iterable[Path]) -> Site:
    """The search path of ``dirs`` (the CLI's --templates over $HPCTRAIN_TEMPLATES and the
    built-in set), with the devcluster's partitions where they belong."""
    here = slurm_partitions.is_devcluster() or not _any_slurm()
    return Site(tuple(Path(d) for d in dirs), here)


def _any_slurm() -> bool:
    return Path(slurm_partitions.conf_path()).is_file() or client.have("scontrol")


def _unknown(name: str, search: list[Path], why: str) -> str:
    files = ", ".join(partition_names(search)) or "none"
    return (f"unknown partition {name!r}: {why}; facts files name: {files} (a sysadmin "
            f"writes one with `hpctrain templates init --from-slurm {name}`)")


def slurm_word(name: str) -> tuple[dict[str, str], list[dict[str, str]]] | None:
    """Slurm's records of partition ``name`` and its nodes, from the cache while fresh."""
    key = (slurm_partitions.conf_path(), name)
    now = time.time()
    held = _WORD.get(key)
    if held and now - held[0] < CACHE_S:
        return held[1]
    path = _cache_file(*key)
    try:
        saved = json.loads(path.read_text())
        if now - float(saved["at"]) < CACHE_S:
            _WORD[key] = (float(saved["at"]), tuple(saved["word"]))
            return _WORD[key][1]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    word = slurm_partitions.show_partition(name)
    if word is not None:       # an unknown name is asked again: it may be created any time
        _WORD[key] = (now, word)
        _save(path, {"at": now, "word": list(word)})
    return word


def slurm_names() -> list[str]:
    """The partitions the active Slurm has; none where Slurm cannot be asked."""
    try:
        return slurm_partitions.names()
    except SlurmError:
        return []


def _cache_file(conf: str, name: str) -> Path:
    from hpctrain.jobs.paths import cache_dir
    cluster = hashlib.sha256(conf.encode()).hexdigest()[:12]
    return cache_dir() / "slurm" / f"{cluster}-{name}.json"


def _save(path: Path, data: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, json.dumps(data), mode=0o600)
    except OSError:
        pass       # a full or read-only home costs the next submit one more question
