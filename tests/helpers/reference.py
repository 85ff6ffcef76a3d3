"""Undisturbed reference runs, run once per suite run for every test that needs the same.

Many cluster tests compare a disturbed job's final parameters, bit for bit, with the same
training undisturbed on local ranks (helpers.warm: forked from a server that imported
torch; under torchrun, 4 ranks and an agent took ~15 s of CPU on this machine, most of it
importing torch). Tests whose reference is the same script, ranks,
arguments and layout share one run: the first to ask starts it, the others wait for its
result, on any xdist worker (a lock file in a directory of this suite run).

``args`` name their paths with ``{out}``, the run's own directory (it has ``ckpt/`` made):
``["--ckpt-dir", "{out}/ckpt", "--final-state", "{out}/ref"]``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from helpers.torchrun import env_for
from helpers.warm import WarmRun

POLL_S = 0.2


def _root() -> Path:
    # one directory per suite run, shared by its xdist workers (serially: this process's)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    root = Path(tempfile.gettempdir()) / f"hpctrain-refs-{run}"
    root.mkdir(mode=0o700, exist_ok=True)
    return root


class Reference:
    """One reference run: its directory (``path``), its output (``out``) and its exit
    code (:meth:`wait`)."""

    def __init__(self, path: Path, lock: int | None, proc: WarmRun | None) -> None:
        self.path, self.out, self._rc = path, path / "out.txt", path / "rc"
        if proc is not None:       # ours: the exit code is written whenever it ends
            threading.Thread(target=self._finish, args=(proc, lock), daemon=True).start()

    def _finish(self, proc: WarmRun, lock: int | None) -> None:
        rc = proc.wait()
        tmp = self._rc.with_suffix(".tmp")
        tmp.write_text(str(rc))
        os.replace(tmp, self._rc)
        if lock is not None:
            os.close(lock)         # (releases the lock)

    def wait(self, timeout: float) -> int:
        """The run's exit code, once it has ended (whoever started it)."""
        deadline = time.monotonic() + timeout
        while not self._rc.exists():
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"reference run in {self.path}", timeout)
            time.sleep(POLL_S)
        return int(self._rc.read_text())


def reference(script: Path, nproc: int, args: list[str], tp: int = 1, pp: int = 1,
              **env: str) -> Reference:
    """The undisturbed run of ``script`` on ``nproc`` local ranks with ``args`` (its paths
    under ``{out}``) and the layout ``tp`` x ``pp``: started now, or already started (or
    done) for another test of this suite run."""
    key = hashlib.sha256(json.dumps([str(script), nproc, args, tp, pp, sorted(env.items())])
                         .encode()).hexdigest()[:16]
    path = _root() / key
    (path / "ckpt").mkdir(parents=True, exist_ok=True)
    lock = os.open(path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:      # another test runs it now
        os.close(lock)
        return Reference(path, None, None)
    if (path / "rc").exists():   # run before
        os.close(lock)
        return Reference(path, None, None)
    argv = [a.replace("{out}", str(path)) for a in args]
    return Reference(path, lock, WarmRun(script, nproc, argv, env_for(tp, pp, **env),
                                         path / "out.txt"))


def gpt_reference_args(total: int) -> list[str]:
    """examples/train_gpt.py's arguments for ``total`` undisturbed steps, seed 11 (the
    seed of helpers.examples' jobs). Saves do not change the training: every test's
    reference of the same steps and layout is this one run."""
    return ["--steps", str(total), "--save-every", "10", "--seed", "11",
            "--ckpt-dir", "{out}/ckpt", "--log-file", "{out}/ref.jsonl",
            "--final-state", "{out}/ref"]
