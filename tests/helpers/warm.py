"""Undisturbed local runs whose ranks are forked from a server that imported torch once.

A reference run (the training a test's disturbed job must equal, bit for bit) only has to
compute the same thing; how its ranks were started is not what any test checks. Under
torchrun each rank imports torch (~1.4 s of CPU here) and ``torch.optim``'s first
constructor imports ``torch._dynamo`` (~1.2 s more); forked from a server that did both
(:func:`helpers.ckpt._forkserver`), a rank starts in milliseconds. A 2-core machine that
runs the suite is CPU-bound, so every second saved is a second of the suite's time.

Each rank runs the script as ``python script.py args`` would (``__main__``, its directory
first on ``sys.path``, the process's own ``argv``, environment and working directory,
stdout and stderr to ``out``, the atexit handlers it registered run at its end), with the
variables torchrun gives a worker of a one-node run, but without an agent: rank 0 hosts
the rendezvous store, as under srun. What is tested under a real launcher stays there
(helpers.torchrun, the devcluster).
"""

from __future__ import annotations

import atexit
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from helpers.ckpt import _forkserver, free_port

ROOT = Path(__file__).resolve().parents[2]


def _rank(script: str, argv: list[str], env: dict[str, str], out: str) -> None:
    """One rank, in the forked process: become ``python script argv`` and run it."""
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)   # as PYTHONUNBUFFERED would have it
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    sys.argv = [script, *argv]
    sys.path.insert(0, str(Path(script).parent))
    import torch

    # torch took its thread count from the server's environment; a fresh process would
    # take OMP_NUM_THREADS from this one (the kernels' reduction order depends on it)
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    atexit._clear()   # the server's handlers are not this process's
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        atexit._run_exitfuncs()


class WarmRun:
    """``nproc`` ranks of one run; :meth:`wait`, :meth:`poll` and :meth:`kill` as a
    ``subprocess.Popen`` of torchrun would answer them (any rank failing: its code)."""

    def __init__(self, script: Path | str, nproc: int, args: list[str], env: dict[str, str],
                 out: Path) -> None:
        ctx = _forkserver()
        common = {**env, "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
                  "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(free_port())}
        self.procs: list[Any] = []
        for rank in range(nproc):
            env_r = {**common, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            proc = ctx.Process(target=_rank, args=(str(script), list(args), env_r, str(out)))
            proc.start()
            self.procs.append(proc)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and all(p.exitcode is not None for p in self.procs):
            self.returncode = next((p.exitcode for p in self.procs if p.exitcode), 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        for proc in self.procs:
            proc.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self.poll() is None:
            raise subprocess.TimeoutExpired(f"warm run of {len(self.procs)} ranks", timeout)
        return self.returncode

    def kill(self) -> None:
        for proc in self.procs:
            if proc.exitcode is None:
                proc.kill()
        for proc in self.procs:
            proc.join(30)


def run(script: Path | str, nproc: int, args: list[str], env: dict[str, str], out: Path,
        timeout: float = 240) -> int:
    """:class:`WarmRun` to its end: the exit code (any rank's failure), as torchrun's."""
    proc = WarmRun(script, nproc, args, env, out)
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
