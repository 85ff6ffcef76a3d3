"""kill -9 during save and during prune, at every commit point and at random times.

Each case really kills a saving subprocess with SIGKILL; afterwards ``load_latest``
must return a complete earlier (or the new, if committed) checkpoint, never a partial.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.ckpt import assert_state_is, child_env, make_state, run_cli

pytestmark = pytest.mark.torch
# tests/, on the savers' sys.path: they import helpers.ckpt
TESTS = Path(__file__).resolve().parents[1]

SAVER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {here!r})
    from helpers.ckpt import make_state
    from hpctrain.checkpoint import CheckpointManager
    root, fault, rows, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with CheckpointManager(root, keep_last=2, async_save=bool(int(sys.argv[5]))) as mgr:
        first = (mgr.latest_step() or 0) + 1
        for step in range(first, first + steps):
            if step == 3 and fault:
                os.environ["HPCTRAIN_CKPT_FAULT"] = fault  # arm only after two commits
            mgr.save(step, make_state(step, rows))
            print(step, flush=True)
""").format(here=str(TESTS))


def _saver(root: Path, fault: str = "", rows: int = 64, steps: int = 4,
           async_save: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SAVER, str(root), fault, str(rows),
                             str(steps), str(int(async_save))], stdout=subprocess.PIPE,
                            text=True, env=child_env())


def _check_recovers(root: Path, rows: int) -> int:
    """A new manager loads a complete step, saves again and everything verifies."""
    from hpctrain.checkpoint import CheckpointManager

    with CheckpointManager(root, keep_last=2) as mgr:
        got = make_state(0, rows)
        step = mgr.load_latest(got)
        assert step is not None and step >= 1
        assert_state_is(got, step)
        assert not [n for n in os.listdir(root) if n.startswith((".tmp-step", ".trash-", ".old-"))]
        mgr.save(step + 1, make_state(step + 1, rows))
    out = run_cli("ckpt", "verify", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    return step


POINTS = {  # fault point -> step load_latest must return after the kill
    "before-write": 2, "file-before-fsync": 2, "before-dir-fsync": 2, "before-rename": 2,
    "after-rename": 3, "before-latest": 3, "after-latest": 3, "prune-after-trash": 3}


@pytest.mark.parametrize("point", sorted(POINTS))
def test_kill_at_each_commit_point(tmp_path: Path, point: str) -> None:
    proc = _saver(tmp_path, point)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, out  # it really died at the point
    assert out.split() == ["1", "2"]
    if point == "prune-after-trash":  # the victim left the namespace whole, as trash
        names = sorted(os.listdir(tmp_path))
        assert [n for n in names if n.startswith("step_")] == ["step_000000002", "step_000000003"]
        assert [n for n in names if n.startswith(".trash-step_000000001.")]
    assert _check_recovers(tmp_path, 64) == POINTS[point]


RESAVER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {here!r})
    from helpers.ckpt import make_state
    from hpctrain.checkpoint import CheckpointManager
    root, fault, async_save = sys.argv[1], sys.argv[2], bool(int(sys.argv[3]))
    with CheckpointManager(root, keep_last=1, async_save=async_save) as mgr:
        mgr.save(5, make_state(5))
        mgr.wait()
        os.environ["HPCTRAIN_CKPT_FAULT"] = fault
        mgr.save(5, make_state(6))  # resumed from 5, saving 5 again: other values
""").format(here=str(TESTS))


# kill point in a re-save of step 5 -> whose content step 5 holds afterwards
RESAVE_POINTS = {"before-rename": 5, "resave-after-aside": 5, "after-rename": 6}


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.parametrize("point", sorted(RESAVE_POINTS))
def test_kill_while_resaving_a_step_leaves_it_loadable(tmp_path: Path, point: str,
                                                       async_save: bool) -> None:
    """keep_last=1 and the only step re-saved: whenever the kill lands, step 5 is there
    afterwards, whole (the old one until the new one is committed, then the new one)."""
    from hpctrain.checkpoint import CheckpointManager

    proc = subprocess.run([sys.executable, "-c", RESAVER, str(tmp_path), point,
                           str(int(async_save))], env=child_env(), timeout=120)
    assert proc.returncode == -signal.SIGKILL  # it really died at the point
    if point == "resave-after-aside":  # the window: no step_5, only the old one set aside
        names = os.listdir(tmp_path)
        assert "step_000000005" not in names and [n for n in names if n.startswith(".old-")]
    with CheckpointManager(tmp_path, keep_last=1) as mgr:  # the next start puts it back
        got = make_state(0)
        assert mgr.load_latest(got) == 5
        assert_state_is(got, RESAVE_POINTS[point])
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith(".hpctrain")) == \
        ["latest", "step_000000005"]


def _kill_run(root: Path, rows: int, async_save: bool, when: Callable[[], object]) -> bool:
    """Start a long saving run, SIGKILL it once ``when()`` says so (after its first commit);
    return whether the kill landed inside a save (its temporary directory was left behind)."""
    proc = _saver(root, rows=rows, steps=1000, async_save=async_save)
    assert proc.stdout is not None
    proc.stdout.readline()  # at least one commit of this run
    when()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return any(n.startswith(".tmp-step") for n in os.listdir(root))


def _until_a_save_is_in_flight(root: Path) -> None:
    """Poll for a save's temporary directory, so the kill lands mid-save whatever the disk."""
    deadline = time.monotonic() + 30
    while not any(n.startswith(".tmp-step") for n in os.listdir(root)):
        assert time.monotonic() < deadline, "no save started within 30 s"
        time.sleep(0.0005)


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True])
def test_kill_at_random_times(tmp_path: Path, async_save: bool) -> None:
    rng = random.Random(5 + async_save)
    rows = 16384  # 16 MiB of w + 16 MiB of exp_avg per step: saves take a while
    for _ in range(3):  # anywhere: mid-save, between saves, mid-prune
        _kill_run(tmp_path, rows, async_save, lambda: time.sleep(rng.uniform(0.0, 0.6)))
        _check_recovers(tmp_path, rows)
    # Random times alone may all miss a save on a fast disk (a CI run did): aim at one.
    # The directory can still be committed between seeing it and the kill, so retry.
    for _ in range(10):
        mid_save = _kill_run(tmp_path, rows, async_save,
                             lambda: _until_a_save_is_in_flight(tmp_path))
        _check_recovers(tmp_path, rows)
        if mid_save:
            break
    assert mid_save, "10 kills aimed at a save in flight all landed outside one"
