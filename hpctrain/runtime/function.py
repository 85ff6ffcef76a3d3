"""A Python callable run on every rank of a function job (``hpctrain.submit_function``).

submitit pickles a :class:`RankCall` at submission and unpickles it in every task of the
job, so this module is in-job code: it imports the rank arithmetic and the protocol, and
nothing from the submission side (tests/unit/test_architecture.py holds it to that).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from hpctrain import hostlist, protocol
from hpctrain.mesh import rank_to_coords
from hpctrain.runtime import teardown


class RankCall:
    """Runs the user's callable on one rank with the distributed environment set.

    Pickled by submitit and unpickled in every task of the job. Existing values (the
    rendered script's launcher sets RANK, MASTER_ADDR, ...) are kept; what is missing
    is derived from Slurm's variables, the same way the templates derive it.
    """

    def __init__(self, fn: Callable[..., Any], layout: Mapping[str, int]) -> None:
        self.fn = fn
        self.layout = dict(layout)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        set_rank_environment(os.environ, self.layout)
        had_group, crashed = teardown.group_exists(), True
        try:
            with rank_log_tee(os.environ):
                result = self.fn(*args, **kwargs)
            crashed = False
            return result
        finally:
            # what the callable set up (init(), a process group) is torn down before
            # submitit pickles the result and the process exits: torch's gloo group left
            # to the interpreter's exit can abort it, and the job would end FAILED
            teardown.after_call(had_group, crashed)


class CheckpointableRankCall(RankCall):
    """A RankCall whose callable implements submitit's ``checkpoint`` (requeue protocol)."""

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit  # in the job only

        delayed = self.fn.checkpoint(*args, **kwargs)
        if delayed is None:
            return None
        return submitit.helpers.DelayedSubmission(
            CheckpointableRankCall(delayed.function, self.layout), *delayed.args, **delayed.kwargs)


class _Tee:
    """A text stream writing to the job log (where every rank's output meets) and to this
    rank's own file (its output alone)."""

    def __init__(self, first: Any, second: Any) -> None:
        self._first, self._second = first, second

    def write(self, text: str) -> int:
        self._second.write(text)
        return self._first.write(text)

    def flush(self) -> None:
        self._first.flush()
        self._second.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._first, name)


@contextlib.contextmanager
def rank_log_tee(env: Mapping[str, str]) -> Iterator[None]:
    """Copy this rank's stdout/stderr to ``FOLDER/<job>_<rank>_log.out`` (``logs --rank``).

    The ranks of an srun job share the batch log; the per-rank copy is what lets
    ``hpctrain logs --rank N`` (and submitit's ``job.stdout()``) show one rank.
    """
    folder, job_id = env.get("SUBMITIT_FOLDER"), env.get("SLURM_JOB_ID")
    if not folder or not job_id:
        yield
        return
    path = Path(folder) / f"{job_id}_{env.get('SLURM_PROCID', '0')}_log.out"
    with open(path, "a", encoding="utf-8", buffering=1) as fh:
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(sys.stdout, fh), _Tee(sys.stderr, fh)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved


def set_rank_environment(env: Any, layout: Mapping[str, int]) -> None:
    """Fill RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT and layout coordinates from SLURM_*."""
    rank = int(env.get("SLURM_PROCID", 0))
    world = int(env.get("SLURM_NTASKS", 1))
    env.setdefault("RANK", str(rank))
    env.setdefault("WORLD_SIZE", str(world))
    env.setdefault("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
    env.setdefault("NODE_RANK", env.get("SLURM_NODEID", "0"))
    if "MASTER_ADDR" not in env:
        env["MASTER_ADDR"] = hostlist.first(env.get("SLURM_JOB_NODELIST", ""))
    env.setdefault("MASTER_PORT", str(protocol.master_port(env.get("SLURM_JOB_ID"))))
    tp, pp = int(layout.get("tp", 1)), int(layout.get("pp", 1))
    dp = world // (tp * pp) if world % (tp * pp) == 0 else 1
    coords = rank_to_coords(rank, tp, dp, pp)
    for name, value in ((protocol.TP, tp), (protocol.DP, dp), (protocol.PP, pp),
                        (protocol.TP_RANK, coords.tp), (protocol.DP_RANK, coords.dp),
                        (protocol.PP_RANK, coords.pp)):
        env.setdefault(name, str(value))
