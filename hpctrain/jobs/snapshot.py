"""The code a job runs, frozen at submission: a content-addressed copy of the working
directory in the job folder, and the facts of where it came from.

A job requeued two days later would otherwise run whatever is on disk *then*. With
``[run] snapshot = true`` (the default for ``--host`` submissions) the source files are
copied to ``<job folder>/snapshots/<id>/`` and the job runs there, on every requeue. The
id is a hash of the files' paths, modes and contents, so the same tree is one copy however
often it is submitted, and a remote copy can be checked against the laptop's.

Which files: in a git work tree, the tracked files and the untracked ones git does not
ignore (what ``git status`` would show you), so a new file you forgot to commit still
runs; elsewhere every file but caches, virtualenvs and VCS directories, less the patterns
in ``.hpctrainignore``. Either way a tree above :data:`MAX_BYTES` is refused, naming its
largest files.

Every submission also leaves its provenance in the job folder
(:mod:`hpctrain.jobs.provenance`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from hpctrain import access
from hpctrain.errors import AccessError, SpecError

MAX_BYTES = 512 * 2**20            # a source tree, not a dataset
MAX_DIFF_BYTES = 8 * 2**20
GIT_TIMEOUT_S = 30
IGNORE_FILE = ".hpctrainignore"
# never part of a snapshot outside git (git's own ignore rules decide inside a work tree)
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".mypy_cache",
             ".pytest_cache", ".ipynb_checkpoints", "node_modules", ".tox", ".eggs"}
SKIP_FILES = ("*.pyc", "*.pyo", ".DS_Store")


@dataclass(frozen=True)
class Entry:
    """One file of a snapshot: its path below the root, kind and content hash."""

    path: str
    kind: str        # "f" file, "x" executable file, "l" symlink (digest of the target)
    digest: str
    size: int


@dataclass(frozen=True)
class Source:
    """A scanned source tree: its root, files, id and what git says about it."""

    root: str
    entries: tuple[Entry, ...]
    id: str
    git: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def paths(self) -> list[str]:
        return [e.path for e in self.entries]


# ---- scanning ------------------------------------------------------------------------------
def scan(root: str | os.PathLike[str], *, use_git: bool = True, max_bytes: int = MAX_BYTES,
         paths: Sequence[str] | None = None) -> Source:
    """The snapshot of ``root`` (see the module doc for which files; ``paths``: exactly
    these); SpecError when it is not a directory or holds more than ``max_bytes``."""
    base = Path(root).absolute()
    if not base.is_dir():
        raise SpecError(f"cannot snapshot {str(base)!r}: not a directory (run from your "
                        "project directory, or set [run] snapshot = false)")
    git = git_facts(base) if use_git and paths is None else {}
    if paths is None:
        paths = git.pop("files", None)
    if paths is None:
        paths = walk(base)
    for p in paths:
        if p.startswith("/") or ".." in p.split("/"):
            raise SpecError(f"snapshot path {p!r} leaves {base}: refusing it")
    entries = tuple(sorted((_entry(base, p) for p in paths if os.path.lexists(base / p)),
                           key=lambda e: e.path))
    total = sum(e.size for e in entries)
    if total > max_bytes:
        biggest = sorted(entries, key=lambda e: -e.size)[:3]
        names = ", ".join(f"{e.path} ({e.size / 2**20:.0f} MiB)" for e in biggest)
        raise SpecError(f"the snapshot of {base} would copy {total / 2**20:.0f} MiB (limit "
                        f"{max_bytes / 2**20:.0f} MiB), largest: {names}. Keep data out of "
                        f"the source tree (.gitignore, or {IGNORE_FILE} outside git), or "
                        "set [run] snapshot = false")
    return Source(str(base), entries, snapshot_id(entries), git)


def snapshot_id(entries: Iterable[Entry]) -> str:
    """12 hex digits naming the content: paths, kinds and digests, in path order. Pure."""
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.path):
        h.update(f"{e.path}\0{e.kind}\0{e.digest}\n".encode())
    return h.hexdigest()[:12]


def _entry(base: Path, rel: str) -> Entry:
    path = base / rel
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path).encode()
        return Entry(rel, "l", hashlib.sha256(target).hexdigest(), 0)
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return Entry(rel, "x" if st.st_mode & 0o100 else "f", h.hexdigest(), st.st_size)


def walk(base: Path) -> list[str]:
    """Every regular file and symlink below ``base`` but :data:`SKIP_DIRS`, :data:`SKIP_FILES`
    and the patterns of ``base/.hpctrainignore`` (fnmatch, matched against the relative
    path and the name). Directories are not followed through symlinks."""
    patterns = list(SKIP_FILES)
    ignore = base / IGNORE_FILE
    if ignore.is_file():
        patterns += [ln.strip().rstrip("/") for ln in ignore.read_text().splitlines()
                     if ln.strip() and not ln.startswith("#")]
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        rel_dir = os.path.relpath(dirpath, base)
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS
                             and not _ignored(_join(rel_dir, d), d, patterns))
        for name in filenames:
            rel = _join(rel_dir, name)
            if not _ignored(rel, name, patterns):
                out.append(rel)
        # symlinked directories are kept as links, not walked
        out += [_join(rel_dir, d) for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return sorted(out)


def _join(rel_dir: str, name: str) -> str:
    return name if rel_dir == "." else f"{rel_dir}/{name}"


def _ignored(rel: str, name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)


# ---- git -----------------------------------------------------------------------------------
def _git(base: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(base), *args], capture_output=True,
                          timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)


def git_facts(base: Path) -> dict[str, Any]:
    """What git says about the work tree holding ``base``: commit, branch, dirty, the diff
    against HEAD, and ``files`` (tracked and unignored untracked files below ``base``).
    {} when ``base`` is not in a work tree or git is missing."""
    try:
        top = _git(base, "rev-parse", "--show-prefix")
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if top.returncode != 0:
        return {}
    listed = _git(base, "ls-files", "-z", "--cached", "--others", "--exclude-standard", ".")
    files = sorted({p for p in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if p})
    head = _git(base, "rev-parse", "--verify", "-q", "HEAD")
    commit = head.stdout.decode().strip() if head.returncode == 0 else ""
    branch = _git(base, "rev-parse", "--abbrev-ref", "HEAD").stdout.decode().strip()
    diff = _git(base, "diff", "HEAD", "--binary", "--", ".").stdout if commit else b""
    status = _git(base, "status", "--porcelain", "--", ".").stdout.decode("utf-8", "replace")
    untracked = [ln[3:] for ln in status.splitlines() if ln.startswith("?? ")]
    return {"files": files, "commit": commit, "branch": "" if branch == "HEAD" else branch,
            "dirty": bool(status.strip()), "untracked": untracked,
            "diff": diff[:MAX_DIFF_BYTES].decode("utf-8", "replace"),
            "diff_truncated": len(diff) > MAX_DIFF_BYTES}


# ---- copying -------------------------------------------------------------------------------
def materialize(source: Source, folder: str | os.PathLike[str], access_level: str) -> Path:
    """Copy ``source`` to ``<folder>/snapshots/<id>`` (once: an existing copy of the same id
    is reused) with the access level's modes, executables keeping their x bit; the path.

    Written to a temporary name and renamed, so a copy that exists is complete."""
    modes = access.modes(access_level)
    parent = Path(folder) / "snapshots"
    why = access.own_dir(parent, modes.dir)
    if why:
        raise AccessError(f"not writing the snapshot into {parent}: {why}")
    dest = snapshot_dir(folder, source.id)
    if dest.is_dir() and not dest.is_symlink():
        return dest
    tmp = parent / f".tmp-{source.id}-{os.getpid()}-{os.urandom(3).hex()}"
    tmp.mkdir(mode=modes.dir)
    try:
        for e in source.entries:
            _copy(Path(source.root) / e.path, tmp / e.path, e, modes)
        try:
            tmp.rename(dest)
        except OSError:
            if not dest.is_dir():   # not a concurrent submission's identical copy
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _copy(src: Path, dst: Path, entry: Entry, modes: access.Modes) -> None:
    dst.parent.mkdir(mode=modes.dir, parents=True, exist_ok=True)
    if entry.kind == "l":
        os.symlink(os.readlink(src), dst)
        return
    mode = modes.file | ((modes.file & 0o444) >> 2 if entry.kind == "x" else 0)
    with open(src, "rb") as fin:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    os.chmod(dst, mode)   # the umask may have taken bits the level grants




# ---- a submission's snapshot ---------------------------------------------------------------
@dataclass(frozen=True)
class Origin:
    """Where a submission's code comes from. On the login node: the spec's workdir or the
    current directory, git read there. For a ``--host`` submission: the staged copy of the
    client's tree, with the client's git facts and the id it computed (the copy must match)."""

    dir: str
    git: dict[str, Any] | None = None     # None: ask git about ``dir`` here
    expect_id: str = ""
    submitted_from: str = ""              # user@host:path of the client
    files: tuple[str, ...] | None = None  # exactly these (the client's list), else scan
    # a --host dry run sends no files, only the id the client computed: named, never read
    known_id: str = ""

    def scan(self) -> Source:
        source = scan(self.dir, use_git=self.git is None, paths=self.files)
        if self.expect_id and source.id != self.expect_id:
            raise SpecError(f"the staged copy {self.dir} has snapshot id {source.id}, the "
                            f"client sent {self.expect_id}: a file changed or went missing "
                            "in transfer; submit again")
        if self.git is not None:
            source = Source(source.root, source.entries, source.id, dict(self.git))
        return source


def snapshot_dir(folder: str | os.PathLike[str], snapshot_id: str) -> Path:
    """Where the snapshot ``snapshot_id`` of a job folder is (see :func:`materialize`)."""
    return Path(folder) / "snapshots" / snapshot_id
