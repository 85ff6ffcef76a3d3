"""SegmentFile's sync while open: what a rank has written is made durable while it learns
whether it must write more, and whatever follows (nothing, a few bytes, more than a bounce
buffer) still gives the file exactly its segments, with the right block checksums."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from hpctrain.checkpoint import checksum
from hpctrain.checkpoint.fileio import BOUNCE, SegmentFile

MiB = 1 << 20


def _segments(*sizes: int) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(sizes))
    return [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]


def _check(path: Path, segments: list[np.ndarray], blocks: list, size: int) -> None:
    data = path.read_bytes()
    assert size == len(data) == sum(s.nbytes for s in segments)  # no alignment padding left
    assert data == b"".join(s.tobytes() for s in segments)
    fn = checksum.get(checksum.DEFAULT)
    offsets = np.cumsum([0] + [s.nbytes for s in segments[:-1]]).tolist()
    assert blocks == [(off, s.nbytes, fn(s)) for off, s in zip(offsets, segments)]


# before the sync | after it: nothing, a little (the synced tail block is rewritten in
# place), more than a bounce buffer (the tail buffer fills up and is sent on)
CASES = {"nothing after": ((5 * MiB + 3,), ()),
         "a little after": ((5 * MiB + 3,), (1000, 7)),
         "a buffer's worth after": ((5 * MiB + 3,), (BOUNCE + MiB,)),
         "aligned before": ((BOUNCE,), (4096,)),
         "empty before": ((), (3 * MiB,))}


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_sync_then_more_gives_the_same_file(tmp_path: Path, case: str, direct: bool) -> None:
    before, after = CASES[case]
    segs = _segments(*before, *after)
    path = tmp_path / "rank00000.bin"
    out = SegmentFile(path, direct=direct)
    blocks = out.write(segs[:len(before)])
    out.start_sync()   # on a second thread; the next write waits for it
    blocks += out.write(segs[len(before):])
    _check(path, segs, blocks, out.close())


def test_a_sync_makes_the_bytes_so_far_whole_on_disk(tmp_path: Path) -> None:
    """After sync() the file already holds every byte written (the padded tail included,
    then cut), before close; close then has nothing to flush and keeps the size."""
    segs = _segments(3 * MiB + 11)
    path = tmp_path / "rank00000.bin"
    out = SegmentFile(path)
    blocks = out.write(segs)
    out.sync()
    assert os.path.getsize(path) == segs[0].nbytes
    assert path.read_bytes() == segs[0].tobytes()
    _check(path, segs, blocks, out.close())


def test_a_failed_sync_surfaces_at_the_next_write_and_abort_leaves_nothing_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An EIO from the disk's flush reaches the writer (who then aborts the save)."""
    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    out = SegmentFile(tmp_path / "rank00000.bin")
    out.write(_segments(1000))
    monkeypatch.setattr(os, "fdatasync", eio)
    out.start_sync()
    with pytest.raises(OSError) as err:
        out.write(_segments(10))
    assert err.value.errno == errno.EIO
    out.abort()
    assert out._syncing is None and out._fd == -1
