"""Counting file events under a directory tree with Linux inotify (ctypes, no package):
what a job costs the shared file system (issue 36's goal: <= 1 event a second per job
under its checkpoint directory, whatever the rank count). Every event but reads and
read-only closes: creations, writes, renames, deletions, attribute changes, opens. The
opens are also counted apart (``opens``): a reader's (``hpctrain status``) cost beside the
job's own changes."""

from __future__ import annotations

import ctypes
import os
import struct
import time
from pathlib import Path

IN_ACCESS, IN_CLOSE_NOWRITE, IN_OPEN = 0x001, 0x010, 0x020
IN_CREATE, IN_ISDIR = 0x100, 0x40000000
MASK = 0x00000FFF & ~IN_ACCESS & ~IN_CLOSE_NOWRITE


class Inotify:
    """Counts events under ``top`` (its subdirectories, and new ones, watched too);
    ``samples`` keeps (time, count) at each :meth:`read`."""

    def __init__(self, top: Path) -> None:
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.count, self.opens, self.paths = 0, 0, {}
        self.names: dict[str, int] = {}      # file name -> events (what writes most)
        self.samples: list[tuple[float, int, int]] = []   # (time, count, opens)
        for folder, _, _ in os.walk(top):
            self.watch(Path(folder))

    def watch(self, folder: Path) -> None:
        wd = self.libc.inotify_add_watch(self.fd, str(folder).encode(), MASK)
        if wd >= 0:
            self.paths[wd] = folder
            for sub in (p for p in folder.iterdir() if p.is_dir()):
                if sub not in self.paths.values():
                    self.watch(sub)

    def read(self) -> int:
        """Take the pending events; the count so far."""
        while True:
            try:
                data = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            at = 0
            while at < len(data):
                wd, mask, _, size = struct.unpack_from("iIII", data, at)
                name = data[at + 16: at + 16 + size].rstrip(b"\0").decode(errors="replace")
                at += 16 + size
                self.count += 1
                self.opens += bool(mask & IN_OPEN)
                self.names[name] = self.names.get(name, 0) + 1
                if mask & IN_ISDIR and mask & IN_CREATE:
                    self.watch(self.paths.get(wd, Path("/")) / name)
        self.samples.append((time.time(), self.count, self.opens))
        return self.count

    def rate(self, start: float, end: float, opens: bool = True) -> float:
        """Events per second between wall times ``start`` and ``end`` (from the samples);
        ``opens=False``: without the opens (what changed)."""
        inside = [(t, c - (0 if opens else o)) for t, c, o in self.samples if start <= t <= end]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    def close(self) -> None:
        os.close(self.fd)
