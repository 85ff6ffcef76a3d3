"""The job index: the log (jobs.jsonl) and the offsets beside it (jobs.idx/), on real files.

Lookups must not read the whole history, yet every line of the log stays found: after a
migration (a log without an index), after an older hpctrain's append, with damaged lines,
with several writers at once, and after the index was lost or damaged (the log is the
truth, the index is rebuilt from it).
"""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from hpctrain.errors import AccessError
from hpctrain.jobs import index, offsets
from hpctrain.jobs.index import JobEntry
from helpers.jobs import isolate


def job(i: int | str, **kw: object) -> JobEntry:
    kw.setdefault("submitted_at", 1.5e9)      # the same entry each time it is built
    return JobEntry(str(i), f"job{i}", "script", f"/jobs/{i}", **kw)  # type: ignore[arg-type]


def sweep(first: int, points: int, arrays: int = 1, name: str = "sw") -> list[JobEntry]:
    """A sweep of ``points`` points in ``arrays`` arrays (ids first, first+1, ...)."""
    size = points // arrays
    return [JobEntry(str(first + a), name, "sweep", "/jobs/sw", sweep_id=str(first),
                     sweep_offset=a * size, num_tasks=size, submitted_at=1.5e9,
                     points=[{"lr": str(a * size + t), "seed": "1"} for t in range(size)])
            for a in range(arrays)]


def old_line(entry: JobEntry) -> str:
    """A line as every hpctrain version writes it."""
    return json.dumps(asdict(entry), sort_keys=True) + "\n"


def old_append(entry: JobEntry) -> None:
    """An older hpctrain's append: the log only, under its flock, no index."""
    with open(index.index_path(), "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(old_line(entry))


def idx_dir() -> Path:
    return index.index_path().with_suffix(".idx")


def indexed() -> dict[str, list[int]]:
    """key -> offsets, as the committed index holds them."""
    state = json.loads((idx_dir() / "state").read_text())
    found: dict[str, list[int]] = {}
    for bucket, size in enumerate(state["sizes"]):
        data = (idx_dir() / f"{bucket:02x}").read_bytes()[:size] if size else b""
        for line in data.splitlines():
            key, _, off = line.rpartition(b" ")
            found.setdefault(json.loads(key), []).append(int(off))
    return {k: sorted(v) for k, v in found.items()}


def from_log() -> dict[str, list[int]]:
    """key -> offsets, from the log itself (what the index must agree with)."""
    found: dict[str, list[int]] = {}
    offset = 0
    for line in index.index_path().read_bytes().split(b"\n")[:-1]:
        try:
            rec = JobEntry.from_dict(json.loads(line))
        except (ValueError, TypeError, AttributeError):
            rec = None
        for key in {rec.job_id, rec.sweep_id} - {""} if rec else ():
            found.setdefault(key, []).append(offset)
        offset += len(line) + 1
    return found


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    isolate(monkeypatch, tmp_path)
    return tmp_path / "cache"


def test_round_trip_and_private_files(cache: Path) -> None:
    entries = [job(1, log="/l/%j.out", checkpoint_dir="/ck", extra={"k": [1, "v"]}),
               *sweep(2, 6, arrays=2), job(4, partition="gpu", num_tasks=8)]
    index.append(entries)
    assert index.load() == entries
    assert index.find("1") == entries[0] and index.find("4") == entries[3]
    assert index.sweep_members("2") == entries[1:3]
    assert os.stat(cache).st_mode & 0o777 == 0o700
    assert os.stat(index.index_path()).st_mode & 0o777 == 0o600
    assert os.stat(idx_dir()).st_mode & 0o777 == 0o700
    assert {os.stat(p).st_mode & 0o777 for p in idx_dir().iterdir()} == {0o600}
    assert index.find("9") is None and index.sweep_members("9") == []


def test_nothing_recorded_yet_creates_nothing(cache: Path) -> None:
    assert index.find("1") is None and index.load() == [] and index.recent(20) == []
    assert index.sweep_members("1") == [] and not cache.exists()


def test_find_by_job_id_array_task_and_sweep_id(cache: Path) -> None:
    index.append([job(i) for i in range(1, 50)])
    arrays = sweep(100, 10, arrays=2)
    index.append(arrays)
    index.append([job(i) for i in range(200, 250)])
    assert index.find("7").name == "job7"
    assert index.find("101_3") == arrays[1]            # an array task: its array's entry
    assert index.find("100_0") == arrays[0]
    # a sweep id: the newest entry of that sweep (listing then asks for its members)
    assert index.find("100").sweep_id == "100"
    assert index.sweep_members("100") == arrays
    assert index.find("300") is None and index.find("300_1") is None


def test_newest_entries_read_from_the_end(cache: Path) -> None:
    # big entries (a sweep's points) so that reading backwards crosses many blocks
    entries = [job(1)]
    for i in range(2, 200, 10):
        entries += [job(i), *sweep(i + 1, 300, arrays=3, name=f"s{i}"), job(i + 4)]
    index.append(entries)
    with open(index.index_path(), "a") as fh:
        fh.write('{"job_id": "damaged", "na\n')          # a crash mid-write: skipped
    index.append([job(500)])
    with open(index.index_path(), "a") as fh:
        fh.write('{"job_id": "501", "name": "cut short"')  # no newline: no line yet
    everything = index.load()
    assert everything == [*entries, job(500)]
    for n in (1, 2, 3, 7, 20, len(everything), len(everything) + 5):
        assert index.recent(n) == everything[-n:]
        assert index.load(n) == everything[-n:]
    assert index.recent(0) == []


def test_sweep_members_of_a_reused_sweep_id(cache: Path) -> None:
    first = sweep(11, 6, arrays=3, name="old")
    index.append(first)
    index.append([job(20), job(11_000)])
    assert index.sweep_members("11") == first
    # the cluster's ids started again (reinstalled): 11 is now another sweep; its
    # members are the new ones only, as `find` gives the newest entry
    second = sweep(11, 4, arrays=2, name="new")
    index.append(second)
    index.append([job(30)])
    assert index.sweep_members("11") == second
    assert index.find("11").name == "new" and index.find("12_1").name == "new"


def test_migration_of_a_log_without_index(cache: Path) -> None:
    cache.mkdir(mode=0o700)
    entries = [job(i) for i in range(3000)] + sweep(5000, 40, arrays=4) + [job(6000)]
    index.index_path().write_text("".join(old_line(e) for e in entries))
    assert not idx_dir().exists()
    for e in entries[:3000] + entries[-1:]:
        assert index.find(e.job_id) == e
    assert index.find("5002") == entries[3002] and index.find("5001_3") == entries[3001]
    assert index.find("5000") == entries[3003]          # a sweep id: its newest array
    assert index.sweep_members("5000") == entries[3000:3004]
    assert idx_dir().is_dir() and indexed() == from_log()
    state = json.loads((idx_dir() / "state").read_text())
    assert state["covered"] == index.index_path().stat().st_size
    index.append([job(7000)])                           # a new writer, after the migration
    assert index.find("7000") == job(7000) and index.find("0") == job(0)


def test_an_older_hpctrain_appending_after_the_upgrade(cache: Path) -> None:
    index.append([job(1), job(2)])
    assert index.find("1") == job(1)
    old_append(job(3))                                  # the index does not know it yet
    old_append(JobEntry("4", "s", "sweep", "/f", sweep_id="4", num_tasks=2))
    assert index.find("3") == job(3)
    assert [r.job_id for r in index.sweep_members("4")] == ["4"]
    index.append([job(5)])
    old_append(job(6))
    assert [r.job_id for r in index.recent(3)] == ["4", "5", "6"]
    assert index.find("6") == job(6) and index.find("2") == job(2)
    assert indexed() == from_log()


def test_damaged_lines_are_skipped(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index.append([job(1)])
    with open(index.index_path(), "a") as fh:
        fh.write('{"job_id": "2", "na\n')                # cut short, then a newline
        fh.write('[1, 2]\n"text"\n\n{"job_id": "3"}\n')  # JSON, but no entry
        fh.write('{"job_id": "4", "name": "x", "kind": "script", "fol')   # no newline
    assert index.find("1") == job(1) and index.find("4") is None
    locks: list[int] = []
    flock = offsets.fcntl.flock
    monkeypatch.setattr(offsets.fcntl, "flock", lambda fd, op: (locks.append(op), flock(fd, op)))
    assert index.find("1") == job(1)
    assert locks == [offsets.fcntl.LOCK_SH]     # a cut-short write alone: nothing to index
    index.append([job(5)])          # not glued to the fragment: its own line, found
    assert [r.job_id for r in index.load()] == ["1", "5"]
    assert index.find("5") == job(5) and index.find("1") == job(1)
    assert index.find("2") is None and index.find("3") is None and index.find("4") is None
    assert index.recent(5) == [job(1), job(5)]
    assert indexed() == from_log()


def _writer(cache: str, worker: int, count: int) -> None:
    os.environ["HPCTRAIN_CACHE_DIR"] = cache
    for i in range(count):
        if worker == 0 and i % 2:       # one of them as an older hpctrain: log only
            old_append(job(f"{worker}{i:04d}"))
        else:
            index.append([job(f"{worker}{i:04d}", points=[{"p": "x" * (i % 50)}])])
        if i % 25 == 0:                 # readers meanwhile: they may index an old tail
            assert index.find(f"{worker}{i:04d}") is not None


def test_concurrent_appends_from_several_processes(cache: Path) -> None:
    index.append([job("seed")])
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(cache), w, 200)) for w in range(1, 5)]
    procs.append(ctx.Process(target=_writer, args=(str(cache), 0, 100)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ids = [r.job_id for r in index.load()]
    want = {f"{w}{i:04d}" for w in range(1, 5) for i in range(200)}
    want |= {f"0{i:04d}" for i in range(100)} | {"seed"}
    assert len(ids) == len(want) and set(ids) == want      # each once, none lost
    for jid in want:
        assert index.find(jid).job_id == jid
    assert indexed() == from_log()                          # log and index agree
    state = json.loads((idx_dir() / "state").read_text())
    assert state["covered"] == index.index_path().stat().st_size


@pytest.mark.parametrize("damage", ["deleted", "state", "bucket", "short bucket",
                                    "wrong offsets", "another log"])
def test_a_lost_or_damaged_index_is_rebuilt_from_the_log(cache: Path, damage: str) -> None:
    entries = [job(i) for i in range(600)] + sweep(1000, 20, arrays=2)
    index.append(entries)
    state_file = idx_dir() / "state"
    state = json.loads(state_file.read_text())
    bucket = max(range(offsets.BUCKETS), key=lambda b: state["sizes"][b])
    path = idx_dir() / f"{bucket:02x}"
    if damage == "deleted":
        shutil.rmtree(idx_dir())
    elif damage == "state":
        state_file.write_text('{"version": 1, "cov')
    elif damage == "bucket":
        path.write_bytes(b"\0" * path.stat().st_size)      # a lost write: zeros
    elif damage == "short bucket":
        path.write_bytes(path.read_bytes()[:10])
    elif damage == "wrong offsets":
        # consistent checksums, but the offsets point at other lines
        data = b"".join(b"%s %d\n" % (k, int(o) + 1) for k, _, o in
                        (line.rpartition(b" ") for line in path.read_bytes().splitlines()))
        path.write_bytes(data)
        state["sizes"][bucket], state["crcs"][bucket] = len(data), offsets.zlib.crc32(data)
        state_file.write_text(json.dumps(state))
    elif damage == "another log":
        # replaced by a longer log with other entries: not the log the index was built from
        others = [JobEntry(str(i), f"other{i}", "script", "/o") for i in range(700)]
        index.index_path().write_text("".join(old_line(e) for e in others))
        entries = others
    for e in [e for e in entries if e.kind == "script"][::7]:
        assert index.find(e.job_id) == e
    if damage != "another log":
        assert index.sweep_members("1000") == entries[-2:]
        assert index.find("1001_4") == entries[-1]
    assert indexed() == from_log()


def test_uncommitted_bucket_lines_of_a_crashed_writer_are_ignored_then_cut(cache: Path) -> None:
    index.append([job(i) for i in range(100)])
    state = json.loads((idx_dir() / "state").read_text())
    _, bucket = offsets._key("42")
    path = idx_dir() / f"{bucket:02x}"
    with open(path, "ab") as fh:
        fh.write(b'"42" 999999\n"42" 12')               # past the committed length
    assert index.find("42") == job(42)
    same = next(i for i in range(100, 10_000) if offsets._key(str(i))[1] == bucket)
    index.append([job(same)])            # the next writer to this bucket cuts them off
    assert b"999999" not in path.read_bytes()
    assert index.find("42") == job(42) and indexed() == from_log()
    assert state["covered"] < json.loads((idx_dir() / "state").read_text())["covered"]


def test_a_read_only_or_full_index_answers_from_memory(cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    index.append([job(1)])
    old_append(job(2))

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(offsets.Store, "_commit", full)
        assert index.find("2") == job(2) and index.find("1") == job(1)
    real_open = os.open

    def read_only(path: object, flags: int, *args: object) -> int:
        if str(path).endswith("jobs.jsonl") and flags & os.O_RDWR:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    shutil.rmtree(idx_dir())
    with monkeypatch.context() as m:
        m.setattr(offsets.os, "open", read_only)
        assert index.find("2") == job(2) and index.recent(1) == [job(2)]
        assert not idx_dir().exists()
    assert index.find("2") == job(2) and indexed() == from_log()   # writable again


def test_symlinks_and_foreign_paths_are_refused(cache: Path, tmp_path: Path) -> None:
    index.append([job(1)])
    elsewhere = tmp_path / "elsewhere.jsonl"
    index.index_path().rename(elsewhere)
    index.index_path().symlink_to(elsewhere)
    with pytest.raises(AccessError, match="jobs.jsonl.*symlink.*HPCTRAIN_CACHE_DIR"):
        index.find("1")
    with pytest.raises(AccessError, match="not recording jobs in .*HPCTRAIN_CACHE_DIR"):
        index.append([job(2)])
    index.index_path().unlink()
    elsewhere.rename(index.index_path())
    shutil.rmtree(idx_dir())
    idx_dir().write_text("not a directory")
    with pytest.raises(AccessError, match="jobs.idx: it is not a directory. Remove it"):
        index.append([job(3)])
    assert [r.job_id for r in index.load()] == ["1"]    # refused before writing the log
