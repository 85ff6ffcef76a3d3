"""CheckpointManager end to end in one process: round trips, async, retention, damage, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from helpers.ckpt import assert_state_is, child_env, loop_ext4, make_state, run_cli, tmpfs
from helpers import admin
from helpers.prereq import require

pytestmark = pytest.mark.torch
# tests/: its subprocess imports helpers.ckpt; the `lfs` stand-in is in its programs/
TESTS = Path(__file__).resolve().parents[1]


def _manager(root: Path, **kw):
    from hpctrain.checkpoint import CheckpointManager

    return CheckpointManager(root, **kw)


def test_save_and_load_latest_round_trip_in_place(tmp_path: Path) -> None:
    import torch

    with _manager(tmp_path) as mgr:
        assert mgr.latest_step() is None and mgr.load_latest(make_state(0)) is None
        mgr.save(100, make_state(100))
        mgr.save(200, make_state(200))
        target = make_state(0)
        w = target["model"]["w"]
        assert mgr.load_latest(target) == 200
        assert target["model"]["w"] is w  # in place: the caller's tensors are filled
        assert_state_is(target, 200)
        mgr.load(100, target)
        assert_state_is(target, 100)
        fresh: dict = {}
        mgr.load(200, fresh)  # an empty state receives every saved value
        assert_state_is(fresh, 200)
        assert fresh["model"]["w"].dtype == torch.float32
    names = sorted(os.listdir(tmp_path))
    assert names == [".hpctrain-ckpt.lock", "latest", "step_000000100", "step_000000200"]
    assert (tmp_path / "latest").read_text() == "step_000000200\n"
    man = json.loads((tmp_path / "step_000000200" / "manifest.json").read_text())
    assert man["step"] == 200 and man["world_size"] == 1 and man["versions"]["torch"]
    # few large files per rank, never one per tensor
    assert sorted(os.listdir(tmp_path / "step_000000200")) == [
        "manifest.json", "manifest.ranks", "rank00000.bin", "rank00000.extra.pkl"]


def test_retention_keeps_last_n_plus_every_kth(tmp_path: Path) -> None:
    with _manager(tmp_path, keep_last=2, keep_every=30) as mgr:
        for step in range(10, 110, 10):
            mgr.save(step, make_state(step, rows=2))
        assert [i.step for i in mgr.list()] == [30, 60, 90, 100]
        assert all(i.valid for i in mgr.list())


def test_async_save_is_durable_after_wait_and_reuses_staging(tmp_path: Path) -> None:
    with _manager(tmp_path, async_save=True, keep_last=5) as mgr:
        state = make_state(1)
        mgr.save(1, state)
        buffers = list(mgr._staging._buffers)
        state["model"]["w"].fill_(-1.0)  # mutating after save() must not reach the disk
        state["data_pos"]["index"] = -5
        mgr.save(2, make_state(2))
        assert [b.data_ptr() for b in mgr._staging._buffers] == [b.data_ptr() for b in buffers]
        mgr.wait()
        assert [i.step for i in mgr.list()] == [1, 2]
        got = make_state(0)
        mgr.load(1, got)
        assert_state_is(got, 1)


def test_async_background_failure_is_raised_at_next_wait(tmp_path: Path) -> None:
    from hpctrain.errors import CheckpointError

    with tmpfs(tmp_path / "small", "1m") as root:
        require(root is not None, "mount -t tmpfs (root in a sandbox that allows mounts)")
        mgr = _manager(root, async_save=True)
        mgr.save(1, make_state(1, rows=4))
        mgr.save(2, make_state(2, rows=4096))  # 4 MiB of w alone: cannot fit in 1 MiB
        with pytest.raises(CheckpointError, match="file system is full"):
            mgr.wait()
        mgr.wait()  # raised once, then cleared
        got = make_state(0, rows=4)
        assert mgr.load_latest(got) == 1
        assert_state_is(got, 1)
        mgr.close()


def test_async_save_is_flushed_at_interpreter_exit(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(TESTS)!r})
        from helpers.ckpt import make_state
        from hpctrain.checkpoint import CheckpointManager
        mgr = CheckpointManager({str(tmp_path)!r}, async_save=True)
        mgr.save(7, make_state(7, rows=20000))   # ~20 MiB, still in flight at exit
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=child_env())
    with _manager(tmp_path) as mgr:
        got = make_state(0, rows=20000)
        assert mgr.load_latest(got) == 7
        assert_state_is(got, 7)


def _damage(root: Path, step: int, how: str) -> Path:
    path = root / f"step_{step:09d}" / "rank00000.bin"
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 3] ^= 0x40
    else:
        data = data[: len(data) - 100]
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_damaged_newest_is_detected_skipped_and_reported(tmp_path: Path, how: str) -> None:
    with _manager(tmp_path) as mgr:
        mgr.save(1, make_state(1))
        mgr.save(2, make_state(2))
    bad = _damage(tmp_path, 2, how)
    with _manager(tmp_path) as mgr:
        got = make_state(0)
        with pytest.warns(RuntimeWarning, match=f"skipping checkpoint step 2: {bad}"):
            assert mgr.load_latest(got) == 1
        assert_state_is(got, 1)
    out = run_cli("ckpt", "verify", str(tmp_path))
    assert out.returncode == 1
    assert str(bad) in out.stdout and "step 1: ok" in out.stdout
    assert "1 of 2 checkpoint(s)" in out.stderr
    assert run_cli("ckpt", "verify", str(tmp_path), "--step", "1").returncode == 0


def test_unreadable_manifest_is_skipped(tmp_path: Path) -> None:
    with _manager(tmp_path) as mgr:
        mgr.save(1, make_state(1))
        mgr.save(2, make_state(2))
        manifest = tmp_path / "step_000000002" / "manifest.json"
        manifest.write_bytes(manifest.read_bytes()[:50])
        assert mgr.latest_step() == 1
        got = make_state(0)
        with pytest.warns(RuntimeWarning, match="manifest.json is not valid JSON"):
            assert mgr.load_latest(got) == 1
        assert_state_is(got, 1)


def test_verification_can_be_turned_off(tmp_path: Path) -> None:
    with _manager(tmp_path) as mgr:
        mgr.save(1, make_state(1))
    _damage(tmp_path, 1, "flip")
    with _manager(tmp_path, verify=False) as mgr:
        assert mgr.load_latest(make_state(0)) == 1  # loads the flipped byte, unchecked


def test_missing_root_is_a_clear_error(tmp_path: Path) -> None:
    from hpctrain.errors import CheckpointError

    with pytest.raises(CheckpointError, match=f"{tmp_path / 'nope'} does not exist.*mkdir -p"):
        _manager(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        _manager(tmp_path / "file")


def test_read_only_root_is_a_clear_error(tmp_path: Path) -> None:
    from hpctrain.errors import CheckpointError

    # root ignores permission bits, so a real read-only mount makes the root unwritable
    with tmpfs(tmp_path / "ro", "1m", "ro") as root:
        require(root is not None, "mount -t tmpfs (root in a sandbox that allows mounts)")
        with pytest.raises(CheckpointError, match="is not writable.*Read-only"):
            _manager(root)


def test_second_job_on_same_root_waits_then_is_refused_as_storage_trouble(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A held lock may be a dead node's (it lingers on a shared file system): wait a
    bounded time, saying so, then refuse as StorageUnavailable (requeued, not a crash)."""
    from hpctrain.errors import StorageUnavailable

    with _manager(tmp_path):
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailable, match=f"locked by another job \\(host=.* "
                                                     f"pid={os.getpid()}\\) \\(waited 2 s\\)"):
            _manager(tmp_path, lock_wait_s=2)
        assert time.monotonic() - t0 >= 2
        assert "waiting up to 2 s for it" in capfd.readouterr().err
        assert run_cli("ckpt", "prune", str(tmp_path), "--keep", "1").returncode == 5
    _manager(tmp_path).close()  # released on close


def test_a_lock_released_while_waiting_is_taken(tmp_path: Path) -> None:
    first = _manager(tmp_path)
    threading.Timer(1.0, first.close).start()
    t0 = time.monotonic()
    _manager(tmp_path, lock_wait_s=30).close()
    assert 0.9 <= time.monotonic() - t0 < 10


def test_bad_state_and_policy_are_refused(tmp_path: Path) -> None:
    import torch

    from hpctrain.errors import CheckpointError

    with pytest.raises(CheckpointError, match="keep_last=0"):
        _manager(tmp_path, keep_last=0)
    with _manager(tmp_path) as mgr:
        with pytest.raises(CheckpointError, match="state must be a dict"):
            mgr.save(1, [torch.zeros(1)])  # type: ignore[arg-type]
        with pytest.raises(CheckpointError, match=r"state key \(1, 2\)"):
            mgr.save(1, {(1, 2): torch.zeros(1)})
        mgr.save(1, {"w": torch.zeros(3)})
        with pytest.raises(CheckpointError, match=r"saved with shape \[3\].*\[4\]"):
            mgr.load(1, {"w": torch.zeros(4)})
        with pytest.raises(CheckpointError, match=r"no tensor at \['v'\]"):
            mgr.load(1, {"v": torch.zeros(3)})
        with pytest.raises(CheckpointError, match=r"no checkpoint for step 9.*\[1\]"):
            mgr.load(9, {})
        assert [i.step for i in mgr.list()] == [1]  # failed calls lost nothing


STANDIN_BIN = TESTS / "programs" / "standin_bin"  # holds the `lfs` stand-in


def test_lfs_setstripe_is_applied_when_lfs_exists(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root, log = tmp_path / "root", tmp_path / "lfs.log"
    root.mkdir()
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}:{os.environ['PATH']}")
    monkeypatch.setenv("LFS_LOG", str(log))
    with _manager(root, stripe_count=4) as mgr:
        mgr.save(3, make_state(3))
    calls = log.read_text().splitlines()
    assert calls == [f"setstripe -c 4 {root}", f"setstripe -c 4 {root}/.tmp-step_000000003"]
    # lfs present but the path is not on Lustre: ignored, the save still commits
    monkeypatch.setenv("LFS_NOT_LUSTRE", "1")
    with _manager(root, stripe_count=4) as mgr:
        mgr.save(4, make_state(4))
        assert mgr.latest_step() == 4
    assert len(log.read_text().splitlines()) == 4
    monkeypatch.setenv("PATH", "/nonexistent")  # no lfs at all: silently skipped
    with _manager(root, stripe_count=4) as mgr:
        mgr.save(5, make_state(5))
    assert len(log.read_text().splitlines()) == 4


@pytest.mark.parametrize("fs", ["tmpfs", "ext4"])  # buffered and O_DIRECT write paths
def test_enospc_is_a_clear_error_and_previous_checkpoint_survives(tmp_path: Path,
                                                                  fs: str) -> None:
    from hpctrain.errors import CheckpointError

    small = tmpfs(tmp_path / "small", "2m") if fs == "tmpfs" else loop_ext4(tmp_path / "small", 4)
    with small as root:
        require(root is not None, f"mounting a small {fs} (root in a sandbox that allows it)")
        for name in os.listdir(root):  # ext4's lost+found
            os.rmdir(root / name)
        with _manager(root) as mgr:
            mgr.save(1, make_state(1, rows=256))  # ~0.4 MiB
            with pytest.raises(CheckpointError, match=r"step 2 was not saved.*file system is "
                                                      r"full.*previous checkpoint \(step 1\)"):
                mgr.save(2, make_state(2, rows=8192))  # ~12 MiB
            assert sorted(os.listdir(root)) == [".hpctrain-ckpt.lock", "latest", "step_000000001"]
            got = make_state(0, rows=256)
            assert mgr.load_latest(got) == 1
            assert_state_is(got, 1)
            mgr.save(3, make_state(3, rows=256))  # the space was given back
        assert run_cli("ckpt", "verify", str(root)).returncode == 0


def test_a_load_adds_what_the_state_leaves_open_and_not_another_stages_layers(
        tmp_path: Path) -> None:
    """A pipeline stage loads its own layers, not every stage's (the whole model fits no
    rank); a top-level entry the state lacks, an empty dict (a fresh optimizer's
    ``state``) and ``{}`` itself are filled from the checkpoint."""
    import torch

    from hpctrain.checkpoint.tree import has_room

    saved = {"model": {"l0": torch.ones(3), "l1": torch.full((3,), 2.0)},
             "optim": {"state": {0: {"exp_avg": torch.full((3,), 3.0)}}, "lr": 0.1},
             "rng": torch.arange(4, dtype=torch.uint8)}
    with _manager(tmp_path) as mgr:
        mgr.save(1, saved)
        stage0 = {"model": {"l0": torch.zeros(3)}, "optim": {"state": {}, "lr": 0.0}}
        assert mgr.load_latest(stage0) == 1
        assert sorted(stage0["model"]) == ["l0"] and torch.equal(stage0["model"]["l0"],
                                                                 torch.ones(3))
        assert torch.equal(stage0["optim"]["state"][0]["exp_avg"], torch.full((3,), 3.0))
        assert torch.equal(stage0["rng"], saved["rng"]) and stage0["optim"]["lr"] == 0.1
        everything: dict = {}
        assert mgr.load_latest(everything) == 1
        assert sorted(everything["model"]) == ["l0", "l1"]
    assert has_room({}, ("model", "l1")) and has_room({"model": {}}, ("model", "l1"))
    assert has_room({"model": {"l0": 1}}, ("rng",))
    assert not has_room({"model": {"l0": 1}}, ("model", "l1"))
    assert has_room({"model": {"l0": None}}, ("model", "l0"))   # a placeholder: replaced
    assert has_room({"model": {"l0": 1}}, ("model", "l0", "x"))


def test_a_load_names_what_did_not_fit_and_refuses_it_when_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 59: a saved tensor the state has no place for was skipped without a word, and
    a value of the state the step lacks kept as silently. Now one line of the job log
    names both; on_unexpected/on_missing="error" refuse the load before anything is
    written, "ignore" says nothing."""
    import torch

    from hpctrain.checkpoint import fit
    from hpctrain.errors import CheckpointError

    def stage0() -> dict:   # a renamed layer (l1 saved, none here) and a new entry (lr)
        return {"model": {"l0": torch.zeros(3)}, "step": 0, "lr": 0.1}

    with _manager(tmp_path) as mgr:
        mgr.save(1, {"model": {"l0": torch.ones(3), "l1": torch.full((3,), 2.0)}, "step": 1})
        capsys.readouterr()
        got = stage0()
        assert mgr.load_latest(got) == 1
        assert torch.equal(got["model"]["l0"], torch.ones(3)) and "l1" not in got["model"]
        assert (got["step"], got["lr"]) == (1, 0.1)
        assert capsys.readouterr().err.splitlines() == [
            "hpctrain: checkpoint step 1: not loaded, no place in the state: model.l1; not in "
            "the step, kept as the state had it: lr (load's on_unexpected=/on_missing=\"error\""
            " refuses such a load, \"ignore\" quiets this line)"]
        for kw, said in (({"on_unexpected": "error"}, r"1 tensor .*no place for: model\.l1;"),
                         ({"on_missing": "error"}, r"no value for 1 entry .*: lr;")):
            for load in (mgr.load_latest, lambda s, **k: mgr.load(1, s, **k)):
                untouched = stage0()
                with pytest.raises(CheckpointError, match=said + " nothing was loaded"):
                    load(untouched, **kw)
                assert torch.equal(untouched["model"]["l0"], torch.zeros(3))
                assert untouched["step"] == 0
        mgr.load(1, stage0(), on_unexpected="ignore", on_missing="ignore")
        mgr.load(1, {"model": {"l0": torch.zeros(3), "l1": torch.zeros(3)}, "step": 0})
        assert capsys.readouterr().err == ""   # ignored, or nothing to say: no line
        with pytest.raises(CheckpointError, match="on_missing='strict'"):
            mgr.load(1, stage0(), on_missing="strict")
    # filled: at the path, beneath it (a fresh optimizer's {}), above it; a placeholder
    # replaced by a saved tensor; the line names the rank under torch.distributed
    state = {"opt": {}, "x": None, "data": {"pos": 3}, "lr": 0.1}
    assert fit.unfilled(state, [("opt", "state", 0, "m"), ("x",), ("data",)]) == [("lr",)]
    assert fit.Misfit(7, fit.Fit(), missing=[("lr",)]).line(rank=0).startswith(
        "checkpoint step 7 (rank 0's state): not in the step")


def test_real_model_and_adam_resume_exactly(tmp_path: Path) -> None:
    import torch

    def build(seed: int):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    def train(model, optim, steps: int) -> None:
        for _ in range(steps):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()

    model, optim = build(0)
    train(model, optim, 3)
    saved_rng = torch.get_rng_state()
    with _manager(tmp_path) as mgr:
        mgr.save(3, {"model": model.state_dict(), "optim": optim.state_dict(),
                     "rng": saved_rng})
        train(model, optim, 2)  # training goes on after the save
        model2, optim2 = build(1)  # a fresh process: other weights, empty optimizer state
        state = {"model": model2.state_dict(), "optim": optim2.state_dict()}
        assert mgr.load_latest(state) == 3
    model2.load_state_dict(state["model"])
    optim2.load_state_dict(state["optim"])
    assert torch.equal(state["rng"], saved_rng)
    # reference: the same seed and batches give the same step-3 model in memory; the same
    # two further batches on both must then give bit-identical parameters
    model3, optim3 = build(0)
    train(model3, optim3, 3)
    batches = [torch.randn(8, 16) for _ in range(2)]
    for m, o in ((model2, optim2), (model3, optim3)):
        for x in batches:
            loss = m(x).pow(2).mean()
            o.zero_grad()
            loss.backward()
            o.step()
    for a, b in zip(model2.parameters(), model3.parameters()):
        assert torch.equal(a, b)


def test_steps_get_the_access_levels_modes_whatever_the_umask(tmp_path: Path) -> None:
    """Checkpoints are private by default (0700/0600) and group-readable by option
    (0750/0640), whatever the writers' umask and the root's own mode."""
    for access, want_dir, want_file in ((None, 0o700, 0o600), ("group", 0o750, 0o640)):
        root = tmp_path / f"r-{access}"
        root.mkdir()
        os.chmod(root, 0o755)  # a root made with the usual umask 022
        old = os.umask(0)  # the writers' umask would make everything 0o777 / 0o666
        try:
            with _manager(root, access=access) as mgr:
                mgr.save(1, make_state(1))
        finally:
            os.umask(old)
        step = root / "step_000000001"
        assert step.stat().st_mode & 0o777 == want_dir
        assert {p.stat().st_mode & 0o777 for p in step.iterdir()} == {want_file}
        assert (root / "latest").stat().st_mode & 0o777 == want_file
    with pytest.raises(Exception, match="access='world' is not an access level"):
        _manager(tmp_path / "r-None", access="world")


def test_a_root_somebody_else_could_write_is_refused_unless_trusted(tmp_path: Path) -> None:
    from hpctrain.errors import CheckpointError

    with _manager(tmp_path) as mgr:
        mgr.save(1, make_state(1))
    os.chmod(tmp_path, 0o1777)  # so that we may still write there once it is not ours
    admin.chown(tmp_path, 65534)  # somebody else's root: planted steps, pickles
    with pytest.raises(CheckpointError, match=r"owned by nobody \(uid 65534\), not by you"
                                              r".*trust=True"):
        _manager(tmp_path)
    with _manager(tmp_path, trust=True) as mgr:
        got = make_state(0)
        assert mgr.load_latest(got) == 1
        assert_state_is(got, 1)
    admin.chown(tmp_path, os.geteuid(), os.getegid())
    os.chmod(tmp_path, 0o777)  # anyone may plant a step
    with pytest.raises(CheckpointError, match="every user may write in it"):
        _manager(tmp_path)
    link = tmp_path.parent / f"{tmp_path.name}-link"
    link.symlink_to(tmp_path)  # the user's own link: its target is judged
    with pytest.raises(CheckpointError, match="every user may write in it"):
        _manager(link)
    os.chmod(tmp_path, 0o1777)  # sticky, like /tmp: only the owner replaces its files
    with _manager(link) as mgr:
        assert mgr.load_latest(make_state(0)) == 1


class _UsersOwnClass:
    """A class of the user's: its pickle names a global the safe unpickler refuses."""

    def __init__(self, n: int) -> None:
        self.n = n


def test_extras_load_through_the_safe_unpickler(tmp_path: Path) -> None:
    """RNG states of Python, numpy and torch load by default; a pickled class of the
    user's is refused by name, before any tensor is overwritten, unless unpickle="any"."""
    import random

    import numpy as np
    import torch

    py_state = random.Random(5).getstate()
    state = make_state(1)
    state["rng"] = {"py": py_state, "np": np.random.RandomState(3).get_state(),
                    "gen": np.random.default_rng(3), "dtype": torch.float16,
                    "size": torch.Size([2, 3])}
    with _manager(tmp_path) as mgr:
        mgr.save(1, state)
        got = make_state(0)
        got["rng"] = {}
        assert mgr.load_latest(got) == 1
    assert got["rng"]["py"] == py_state
    assert got["rng"]["gen"].random() == np.random.default_rng(3).random()
    assert (got["rng"]["dtype"], got["rng"]["size"]) == (torch.float16, torch.Size([2, 3]))
    plant = make_state(2)
    plant["loader"] = _UsersOwnClass(7)
    with _manager(tmp_path) as mgr:
        mgr.save(2, plant)
        got = make_state(0)
        got["loader"] = None
        with pytest.raises(Exception, match=r"pickled .*_UsersOwnClass, which the safe "
                                            r"unpickler refuses.*unpickle=\"any\""):
            mgr.load(2, got)
        got.pop("loader")
        assert_state_is(got, 0)  # refused before a single tensor was read
    with _manager(tmp_path, unpickle="any") as mgr:
        got = make_state(0)
        got["loader"] = None
        mgr.load(2, got)
        assert got["loader"].n == 7


def test_files_another_writer_puts_in_a_step_are_committed_and_checked(tmp_path: Path) -> None:
    """save_files: a callback's files (DeepSpeed's) go through the same commit, and
    first_loadable skips a damaged step as load_latest does."""
    from hpctrain.errors import CheckpointCorrupt, CheckpointError

    def write(step: int):
        def to(tmp: Path) -> None:
            (tmp / "engine").mkdir()
            (tmp / "engine" / "weights.pt").write_bytes(bytes([step]) * 5000)
        return to

    with _manager(tmp_path) as mgr:
        for step in (1, 2):
            mgr.save_files(step, write(step), {"kind": "engine"})
        with pytest.raises(CheckpointError, match=r"step 3 was not saved: RuntimeError: "
                                                  r"engine broke; the previous checkpoint"):
            mgr.save_files(3, _broken_engine, {"kind": "engine"})
        assert [(i.step, i.kind, i.bytes, i.valid) for i in mgr.list(verify=True)] == [
            (1, "engine", 5000, True), (2, "engine", 5000, True)]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-step")]
    (tmp_path / "step_000000002" / "engine" / "weights.pt").write_bytes(b"\0" * 5000)
    (problem,) = run_cli("ckpt", "verify", str(tmp_path)).stdout.splitlines()[1:2]
    assert "step 2:" in problem and "engine/weights.pt: checksum mismatch" in problem

    def check(step: int) -> None:
        from hpctrain.checkpoint.reader import verify_step

        problems = verify_step(tmp_path / f"step_{step:09d}")
        if problems:
            raise CheckpointCorrupt(problems[0])

    with _manager(tmp_path) as mgr:
        with pytest.warns(RuntimeWarning, match="skipping checkpoint step 2: .*weights.pt"):
            assert mgr.first_loadable(check) == 1
        with pytest.raises(CheckpointError, match="weights.pt: checksum mismatch"):
            mgr.first_loadable(check, step=2)  # asked for by name: not skipped


def test_foreign_files_rank_0_cannot_read_back_fail_the_save_for_every_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError while rank 0 checksums another writer's files is a CheckpointError that
    every rank hears in the commit's broadcast (it escaped rank 0 alone: the others waited
    forever), and the previous step stays."""
    from hpctrain.checkpoint import manager as manager_module
    from hpctrain.errors import CheckpointError

    def unreadable(root: Path, exclude: set[str]):
        raise OSError(5, "Input/output error")

    with _manager(tmp_path) as mgr:
        mgr.save_files(1, lambda tmp: (tmp / "w.pt").write_bytes(b"1" * 100), {"kind": "x"})
        monkeypatch.setattr(manager_module, "hash_files", unreadable)
        with pytest.raises(CheckpointError, match=r"commit step 2 .*Input/output error"):
            mgr.save_files(2, lambda tmp: (tmp / "w.pt").write_bytes(b"2" * 100),
                           {"kind": "x"})
        assert mgr.latest_step() == 1
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-step")]


def _broken_engine(tmp: Path) -> None:
    (tmp / "half.pt").write_bytes(b"x")
    raise RuntimeError("engine broke")
