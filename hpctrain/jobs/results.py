"""A function job's results: submitit's result files, one per rank, and what they hold.

submitit's entry point leaves ``FOLDER/JOBID_TASK_result.pkl`` holding ``("success", value)``
or ``("error", traceback text)``. The login node reads the files (:func:`read_result_files`;
the cluster side of ``--host`` sends their bytes to the client), and whoever holds the
bytes turns them into the value or the error with :func:`decode_results`: the one
unpickling of results, for :class:`~hpctrain.jobs.handle.Job` and
:class:`~hpctrain.remote.client.RemoteJob` alike. No submitit import.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any, Sequence

from hpctrain.errors import JobError

# A result file written on a compute node can reach a shared file system's other clients
# after Slurm has said the job ended: wait this long for it (submitit's own allowance).
RESULT_WAIT_S = 15.0


def result_path(folder: str | os.PathLike[str], job_id: str, task: int) -> Path:
    """Where submitit leaves rank ``task``'s result of job ``job_id``."""
    return Path(folder) / f"{job_id}_{task}_result.pkl"


def read_result_files(folder: str | os.PathLike[str], job_id: str, num_tasks: int,
                      wait_s: float = 0.0, poll_s: float = 1.0) -> list[bytes | None]:
    """Every rank's result file's bytes (None for a rank without one), after waiting up
    to ``wait_s`` for missing ones to appear."""
    paths = [result_path(folder, job_id, t) for t in range(max(1, num_tasks))]
    deadline = time.monotonic() + wait_s
    while not all(p.exists() for p in paths) and time.monotonic() < deadline:
        _refresh(Path(folder))
        time.sleep(poll_s)
    out: list[bytes | None] = []
    for path in paths:
        try:
            out.append(path.read_bytes())
        except FileNotFoundError:
            out.append(None)
    return out


def _refresh(folder: Path) -> None:
    """Make NFS revalidate the folder's listing (a no-op change of its mode, as submitit)."""
    try:
        folder.chmod(folder.stat().st_mode)
    except OSError:
        pass


def decode_results(job_id: str, state: object, blobs: Sequence[bytes | None],
                   logs_hint: str) -> Any:
    """The value of a one-rank job, the list by rank of a multi-rank one, from the ranks'
    result files' bytes. A rank without a result (cancelled, preempted and not requeued,
    a node lost) is a JobError naming the job's ``state`` and ``logs_hint`` (the command
    that shows why); a rank that raised is a JobError with its traceback, first: srun ends
    the others when one fails, and they may leave no result (seen under load: rank 1
    raised, rank 0 was ended before it wrote one; the error had been "without a result
    for rank 0")."""
    decoded = [None if blob is None else pickle.loads(blob) for blob in blobs]
    for i, found in enumerate(decoded):
        if found is not None and found[0] == "error":
            missing = [r for r, f in enumerate(decoded) if f is None]
            more = f" (rank(s) {','.join(map(str, missing))} left no result: the step " \
                   "was ended)" if missing else ""
            raise JobError(f"job {job_id}, rank {i} raised{more}:\n{found[1]}")
    values = []
    for i, found in enumerate(decoded):
        if found is None:
            raise JobError(f"job {job_id} ended {state} without a result for rank {i}: "
                           f"{logs_hint} shows why")
        values.append(found[1])
    return values if len(values) > 1 else values[0]
