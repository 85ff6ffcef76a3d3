"""Helpers shared by the checkpoint tests: states whose content encodes their step."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

from helpers import admin

REPO = Path(__file__).resolve().parents[2]
HPCTRAIN = Path(sys.executable).with_name("hpctrain")


def make_state(step: int, rows: int = 64) -> dict:
    """A model+optimizer-like state whose every value says which step it belongs to."""
    import torch

    return {"model": {"w": torch.full((rows, 256), float(step)),
                      "b": torch.full((256,), float(step), dtype=torch.bfloat16),
                      "n": torch.tensor(step)},
            "optim": {"state": {0: {"exp_avg": torch.full((rows, 256), step / 2)}},
                      "param_groups": [{"lr": 0.1, "params": [0]}]},
            "step": step, "data_pos": {"epoch": 1, "index": step * 10}}


def assert_state_is(state: dict, step: int) -> None:
    """Every tensor and extra of ``state`` is exactly the content saved at ``step``."""
    import torch

    assert state["step"] == step
    assert state["data_pos"] == {"epoch": 1, "index": step * 10}
    assert torch.equal(state["model"]["w"], torch.full_like(state["model"]["w"], float(step)))
    assert torch.equal(state["model"]["b"], torch.full_like(state["model"]["b"], float(step)))
    assert int(state["model"]["n"]) == step
    exp_avg = state["optim"]["state"][0]["exp_avg"]
    assert torch.equal(exp_avg, torch.full_like(exp_avg, step / 2))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HPCTRAIN), *args], capture_output=True, text=True, timeout=120)


@contextlib.contextmanager
def tmpfs(where: Path, size: str, *options: str) -> Iterator[Path | None]:
    """A real small tmpfs mounted at ``where``, this user's (None when this sandbox cannot
    mount). Mounting is the operator's step (:mod:`helpers.admin`)."""
    where.mkdir(parents=True, exist_ok=True)
    opts = ",".join([f"size={size}", f"uid={os.geteuid()}", f"gid={os.getegid()}",
                     "mode=0700", *options])
    done = admin.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], check=False)
    if done.returncode != 0:
        yield None
        return
    try:
        yield where
    finally:
        admin.run(["umount", "-l", str(where)], check=False)


def child_env(**extra: str) -> dict:
    env = {**os.environ, **extra}
    env.pop("HPCTRAIN_CKPT_FAULT", None)
    env.update(extra)
    return env


@contextlib.contextmanager
def loop_ext4(where: Path, size_mb: int) -> Iterator[Path | None]:
    """A real small ext4 on a loop device (O_DIRECT works there, unlike tmpfs), its root
    handed to this user. Making and mounting it are the operator's steps."""
    image = where.with_name(where.name + ".img")
    where.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    made = admin.run(["mkfs.ext4", "-q", "-F", str(image)], check=False)
    done = made.returncode == 0 and admin.run(
        ["mount", "-o", "loop", str(image), str(where)], check=False).returncode == 0
    if not done:
        image.unlink(missing_ok=True)
        yield None
        return
    try:
        admin.chown(where, os.geteuid(), os.getegid())
        yield where
    finally:
        admin.run(["umount", "-l", str(where)], check=False)
        image.unlink(missing_ok=True)


LOCAL_PORTS = range(10000, 15000)   # below the kernel's ephemeral range (32768-60999)


def free_port() -> int:
    """A TCP port free on this machine now (for a local process group's rendezvous), from
    LOCAL_PORTS: a port the kernel hands out (bind to 0) can be taken by any outgoing
    connection (the other workers' gloo pairs) before rank 0's store binds it, and the
    other ranks then wait minutes for a store that never comes."""
    for _ in range(200):
        port = random.choice(LOCAL_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {LOCAL_PORTS.start}-{LOCAL_PORTS.stop - 1}")


def one_file(manifest, version: int = 4) -> dict:
    """``manifest`` (every rank's entries) as formats 1-4 held it: one JSON document, the
    tensors' sums under ``crc32`` below version 4, no ``checksum`` field in version 1-2."""
    tensors = [t.to_json() for t in manifest.tensors]
    if version < 4:
        for t in tensors:
            t["crc32"] = t.pop("sum")
    raw = {"format": "hpctrain-checkpoint", "format_version": version, "step": manifest.step,
           "created": manifest.created, "world_size": manifest.world_size,
           "layout": manifest.layout, "versions": manifest.versions,
           "files": [f.to_json() for f in manifest.files], "tensors": tensors,
           "extras": [e.to_json() for e in manifest.extras]}
    if version >= 3:
        raw["checksum"] = manifest.checksum
    return raw


def as_format(step_dir: Path, version: int) -> None:
    """Rewrite a committed step's manifest as hpctrain 0.3 to 0.7 wrote it (``version`` 3
    or 4: one ``manifest.json``, no ``manifest.ranks``)."""
    import json

    from hpctrain.checkpoint.manifest import MANIFEST, RANKS
    from hpctrain.checkpoint.reader import read_manifest

    whole = read_manifest(step_dir)
    (step_dir / MANIFEST).write_text(json.dumps(one_file(whole, version)))
    (step_dir / RANKS).unlink()


def whole_manifest(step_dir: Path) -> dict:
    """A step's manifest, every rank's entries, as one JSON object (``format_version`` as
    the step's head says), whichever format the step is in."""
    import json

    from hpctrain.checkpoint.manifest import MANIFEST
    from hpctrain.checkpoint.reader import read_manifest

    raw = one_file(read_manifest(step_dir))
    raw["format_version"] = json.loads((step_dir / MANIFEST).read_text())["format_version"]
    return raw


def spawn(fn: Any, args: tuple, nprocs: int, join: bool = True) -> Any:
    """``torch.multiprocessing.spawn``'s contract (``fn(rank, *args)`` on ``nprocs`` local
    processes), the processes forked from a server that imported torch once
    (multiprocessing's forkserver, torch preloaded): a rank starts in milliseconds instead
    of importing torch itself (~2 s of CPU each, the bulk of these tests' time)."""
    import torch.multiprocessing as mp

    _forkserver()
    return mp.start_processes(fn, args=args, nprocs=nprocs, join=join,
                              start_method="forkserver")


def _forkserver() -> Any:
    """multiprocessing's forkserver context, its server preloading torch (the preload has
    no effect once this process's server runs: it has them already). ``torch._dynamo``
    too: ``torch.optim``'s first constructor imports it (helpers.warm's training runs)."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo",
                                            "hpctrain.checkpoint"])
    return multiprocessing.get_context("forkserver")


class Forked:
    """A process forked (as :func:`spawn`'s ranks are) to run ``fn(said, *args)``, where
    ``said`` is the write end of a pipe: what it sends, :meth:`said` gives back in order.
    For savers a test kills: killing one costs no torch import to start the next."""

    def __init__(self, fn: Any, *args: Any) -> None:
        ctx = _forkserver()
        self._in, out = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=fn, args=(out, *args))
        self.proc.start()
        out.close()

    def next(self, timeout: float = 120) -> Any:
        """The next thing the process said; EOFError once it is gone."""
        if not self._in.poll(timeout):
            raise TimeoutError(f"nothing said within {timeout} s")
        return self._in.recv()

    def said(self, timeout: float = 120) -> list[Any]:
        """Everything it said until it ended (waits for its end)."""
        got = []
        try:
            while True:
                got.append(self.next(timeout))
        except EOFError:
            pass
        self.proc.join(timeout)
        return got

    def kill(self) -> int | None:
        """SIGKILL, and its exit code once it is gone (-9)."""
        self.proc.kill()
        self.proc.join(60)
        return self.proc.exitcode
