"""Who may read what hpctrain writes, and which existing paths it may reuse.

On a shared login node, /tmp and shared storage are written by hundreds of users. So every
directory hpctrain makes for a user (job folders, their root, checkpoint roots' steps) is
made with an explicit mode, and a path that already exists is reused only when it is this
user's (or root's), not a symlink someone else made, and not writable by every user:
anything else may be a neighbour's plant, and is refused with the path and its owner
named (never followed, never fixed up).

Two access levels, the same words in the spec (``[run] access``, ``[checkpoint] access``)
and the Python API:

``private`` (the default)
    directories 0700, files 0600, umask 077 in the job;
``group``
    directories 0750, files 0640, umask 027: the group may read, never write.

Standard library only, no I/O at import: cheap on the login node and in every rank.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

ACCESS_LEVELS = ("private", "group")


@dataclass(frozen=True)
class Modes:
    """The modes of one access level."""

    dir: int
    file: int
    umask: int


_MODES = {"private": Modes(0o700, 0o600, 0o077), "group": Modes(0o750, 0o640, 0o027)}


def modes(access: str) -> Modes:
    """Modes of an access level; ValueError naming the levels for anything else."""
    try:
        return _MODES[access]
    except KeyError:
        raise ValueError(f"access={access!r} is not an access level: use one of "
                         f"{', '.join(ACCESS_LEVELS)}") from None


def owner_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` when the account is unknown here."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def unsafe_reason(path: Path, st: os.stat_result | None = None) -> str | None:
    """Why an existing ``path`` must not be reused as this user's own, or None.

    ``st`` is its lstat when the caller has it. Trusted: what this user or root owns (root
    could do anything anyway; a site's /scratch is root's). Refused: a symlink someone
    else made (it may point anywhere, e.g. into the victim's home; the user's own link,
    like ~/ckpt -> /lustre/..., is judged by its target), anything another user owns, and
    a directory every user may write without the sticky bit (anyone could swap what is
    inside).
    """
    st = st or os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (os.geteuid(), 0):
            return (f"it is a symlink (to {os.readlink(path)}) made by "
                    f"{owner_name(st.st_uid)}, which hpctrain never follows")
        st = os.stat(path)
    if st.st_uid not in (os.geteuid(), 0):
        return f"it is owned by {owner_name(st.st_uid)}, not by you ({owner_name(os.geteuid())})"
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        return f"every user may write in it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def own_dir(path: Path, mode: int, *, parents: bool = True) -> str | None:
    """Make directory ``path`` with ``mode``, or check the one that exists; returns why it
    is unsafe (then nothing was changed), else None.

    A new directory gets exactly ``mode`` (not the umask's); an existing one of this user's
    is left as the user set it (a user who opened a folder up meant to). Missing parents
    are made with the same mode.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if parents and path.parent != path and not path.parent.exists():
            why = own_dir(path.parent, mode)
            if why:
                return f"{path.parent}: {why}"
        try:
            os.mkdir(path, mode)
        except FileExistsError:  # made meanwhile (by whom?): check it like any other
            return own_dir(path, mode, parents=False)
        os.chmod(path, mode)  # mkdir applied the umask
        return None
    why = unsafe_reason(path, st)
    if why is None and not path.is_dir():
        why = "it is not a directory"
    return why
