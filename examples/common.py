"""What the example scripts share: command line, the step log, the final-state dump."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from hpctrain.checkpoint import CheckpointManager


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=200, help="train until this many steps are done")
    # in a job, CheckpointManager() takes both from the spec's [checkpoint] table
    p.add_argument("--ckpt-dir", default=None,
                   help="checkpoint root on shared storage [default: the spec's "
                        "[checkpoint] dir]")
    p.add_argument("--save-every", type=int, default=None,
                   help="periodic checkpoint interval [default: the spec's [checkpoint] "
                        "interval_steps]")
    p.add_argument("--seed", type=int, default=0)
    # --log-file first: torchrun's own argparse rejects a bare --log as ambiguous
    p.add_argument("--log-file", "--log", dest="log", default=None,
                   help="JSON-lines step log, rank 0 appends (use --log-file under torchrun)")
    p.add_argument("--crash-at-step", type=int, default=None,
                   help="raise an exception before this step (the user-crash test)")
    p.add_argument("--final-state", default=None,
                   help="write each rank's final local parameters to FILE.rank<R>.pt")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="sleep this long per step (to make a job last long enough to preempt)")
    p.add_argument("--inprocess", action="store_true",
                   help="run under hpctrain.runtime.run: a failed attempt (a crash, a hang "
                        "the supervisor interrupts) starts again in these processes")
    p.add_argument("--snapshot-every", type=int, default=0,
                   help="also keep the state in memory every N steps (no disk): a restart "
                        "in these processes resumes from it")
    p.add_argument("--fault", action="append", default=[],
                   help="KIND@STEP:RANK[:ATTEMPT], for the in-process tests: crash, hang "
                        "(Python), stop (SIGSTOP), collective-hang, device-error (CUDA's, "
                        "simulated), save-crash, load-crash (STEP ignored), on that attempt "
                        "(default 0) of the first run")
    args = p.parse_args(argv)
    if args.steps < 0 or (args.save_every is not None and args.save_every < 1):
        p.error(f"--steps={args.steps} must be >= 0 and --save-every={args.save_every} >= 1")
    return args


def checkpoints(args: argparse.Namespace) -> CheckpointManager:
    """The checkpoint manager: the spec's [checkpoint] dir, keep_last, keep_every and
    interval in a job (CheckpointManager() alone), --ckpt-dir/--save-every by hand."""
    if args.ckpt_dir:
        os.makedirs(args.ckpt_dir, exist_ok=True)  # every rank: the manager checks visibility
    return CheckpointManager(args.ckpt_dir, interval_steps=args.save_every)


class StepLog:
    """One JSON line per finished step, appended by rank 0 and flushed at once, so a
    killed job's log still shows every step it finished. Resumes append to it."""

    def __init__(self, path: str | None, enabled: bool) -> None:
        self._fh = None
        if path and enabled:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as training

    def write(self, **fields: object) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps({"time": round(time.time(), 3), **fields}) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())  # a preempted node may vanish right after

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


def dump_final_state(path: str | None, rank: int, model: torch.nn.Module) -> None:
    """Each rank's own parameters (local shards for DTensors), for exact comparisons."""
    if not path:
        return
    local = {}
    for name, p in model.named_parameters():
        t = p.detach()
        local[name] = (t.to_local() if hasattr(t, "to_local") else t).clone().cpu()
    torch.save(local, f"{path}.rank{rank}.pt")


class Faults:
    """Failures injected for the in-process restart tests (``--fault``), each on one rank,
    one attempt of the job's first run: ``crash`` raises before the step (``device-error``
    as CUDA's sticky errors do: the process cannot go on), ``hang`` sleeps
    in Python before it (the others wait in the step's collectives), ``stop`` freezes the
    process (SIGSTOP: no Python runs), ``collective-hang`` waits in a receive nobody sends
    (stuck in C++, as the others then are), ``save-crash`` saves an extra that cannot be
    pickled (the save fails on every rank), ``load-crash`` raises while the others load."""

    def __init__(self, specs: list[str], rank: int, attempt: int, restart: int) -> None:
        self.mine: dict[str, int] = {}
        for spec in specs if restart == 0 else []:
            kind, _, where = spec.partition("@")
            step, rank_s, *att = where.split(":")
            if int(rank_s) == rank and int(att[0] if att else 0) == attempt:
                self.mine[kind] = int(step)

    def hit(self, kind: str, step: int | None = None) -> bool:
        return kind in self.mine and (step is None or self.mine[kind] == step)

    def before_step(self, step: int) -> None:
        import signal

        if self.hit("crash", step):
            raise RuntimeError(f"--fault crash@{step}: simulated crash")
        if self.hit("device-error", step):   # CUDA's sticky error, as torch raises it
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered"
                                         f" (--fault device-error@{step}: simulated)")
        if self.hit("hang", step):
            while True:
                time.sleep(3600)
        if self.hit("stop", step):
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.hit("collective-hang", step):
            import torch.distributed as dist

            peer = (dist.get_rank() + 1) % dist.get_world_size()
            dist.recv(torch.zeros(1), src=peer, tag=4242)   # nobody sends it
