"""What every job handle answers, here or on a ``--host`` cluster; when a job is over; the
one wait loop.

:class:`JobHandle` is the contract of :class:`hpctrain.Job <hpctrain.jobs.handle.Job>` (this
login node: Slurm and the job's files) and :class:`hpctrain.RemoteJob
<hpctrain.remote.client.RemoteJob>` (a cluster over ssh, each call one round trip): the same
names, the same answers. :func:`is_over` is the one "has it ended for good" and
:func:`wait_for` the one wait loop, whoever produces the job's successive states.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterator

from hpctrain.errors import JobError
from hpctrain.jobs.poll import JobInfo
from hpctrain.slurm.states import State

POLL_S = 2.0          # how often a wait asks Slurm, by default, at first
# while nothing changes the wait asks less often, up to this: 40 users waiting on one
# login node then ask the controller 4 times a second, not 20 (a change: POLL_S again)
MAX_POLL_S = 10.0
# between those polls a waiting view (submit --wait, status --watch) shows a running job's
# step again this often: it asks the job's supervisor (hpctrain.protocol.live), not Slurm
LIVE_S = 2.0
# one step of a wait: what Slurm says now, and whether the job has ended for good
Update = tuple[JobInfo, bool]
OnUpdate = Callable[[JobInfo], None]


def backoff(pause_s: float, base_s: float, changed: bool) -> float:
    """The next pause of a view that polls Slurm (``submit --wait``, ``status --watch``):
    ``base_s`` after a change, else half as long again, up to MAX_POLL_S. One rule for
    both, so that many users waiting or watching load slurmdbd no more than needed; an
    interval asked for above MAX_POLL_S stays as asked."""
    return base_s if changed else min(pause_s * 1.5, max(base_s, MAX_POLL_S))


def is_over(info: JobInfo, queued: Callable[[], bool]) -> bool:
    """Has the job ended for good? Interruptions count only once Slurm did not requeue.

    ``queued`` is asked only for PREEMPTED/TIMEOUT/NODE_FAIL (one squeue call), because
    a requeued job's sacct record can show the interruption for a moment before the
    job is PENDING again. A job that left the queue without accounting (ENDED) is over.
    """
    if not info.state.final:
        return False
    if info.state.may_resume:
        return not queued()
    return True


def wait_for(job_id: str, updates: Iterator[Update], timeout_s: float | None = None,
             on_update: OnUpdate | None = None, cancel_hint: str = "cancel it") -> JobInfo:
    """Follow ``updates`` until the job has ended for good; its last info.

    ``on_update`` sees every update. A wait longer than ``timeout_s`` raises JobError (the
    job keeps running; ``cancel_hint`` says how to stop it), and so does a stream of
    updates that ends before the job does (a lost connection).
    """
    start = time.monotonic()
    last: JobInfo | None = None
    try:
        for info, over in updates:
            last = info
            if on_update is not None:
                on_update(info)
            if over:
                return info
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                break
    finally:
        close = getattr(updates, "close", None)   # a generator: ends what it runs (ssh)
        if close is not None:
            close()
    if timeout_s is None:
        raise JobError(f"lost the wait on job {job_id}")
    raise JobError(f"job {job_id} still {last.state if last else 'UNKNOWN'} after "
                   f"{timeout_s:g}s (it keeps running; wait again or {cancel_hint})")


class JobHandle(ABC):
    """A submitted job, wherever it runs: ``job_id``, ``name``, ``info()``, ``state``,
    ``done()``, ``wait()``, ``logs()``, ``follow()``, ``cancel()``, ``result()``.

    Implementations give the job's successive states (:meth:`updates`); waiting is the
    same loop for all (:func:`wait_for`).
    """

    job_id: str
    # how the user stops a job that outlives a wait (the timeout's message)
    cancel_hint = "cancel it"

    @property
    @abstractmethod
    def name(self) -> str:
        """The job's name ('' when not known)."""

    @abstractmethod
    def info(self) -> JobInfo:
        """What Slurm says now, requeue causes completed by the job's ledger."""

    @property
    def state(self) -> State:
        """The hpctrain state (see :mod:`hpctrain.slurm.states`)."""
        return self.info().state

    @abstractmethod
    def done(self) -> bool:
        """Has the job ended for good (see :func:`is_over`)?"""

    @abstractmethod
    def updates(self, poll_s: float = POLL_S, timeout_s: float | None = None
                ) -> Iterator[Update]:
        """The job's state now and after each poll (or change), until it has ended for
        good; a stream that may end early after ``timeout_s`` (a remote one does)."""

    def wait(self, timeout_s: float | None = None, poll_s: float = POLL_S,
             on_update: OnUpdate | None = None) -> JobInfo:
        """Block until the job has ended for good; return its last info.

        Requeues (preemption, time limit, node loss) do not end the wait. ``on_update``
        is called with every new poll (``submit --wait`` prints progress with it).
        """
        return wait_for(self.job_id, self.updates(poll_s, timeout_s), timeout_s, on_update,
                        self.cancel_hint)

    @abstractmethod
    def logs(self, rank: int | None = None) -> str:
        """The job's output so far (one rank's with ``rank``); '' before it starts."""

    @abstractmethod
    def follow(self, rank: int | None = None) -> Iterator[str]:
        """The log's lines as they are written, until the job has ended."""

    @abstractmethod
    def cancel(self) -> None:
        """Cancel the job; cancelling an ended job is not an error."""

    @abstractmethod
    def result(self, timeout_s: float | None = None) -> Any:
        """A function job's return value (a list by rank for several ranks), once it has
        ended; JobError for a script job, and with the traceback when a rank raised."""
