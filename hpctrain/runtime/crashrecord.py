"""The user-crash exit record: an uncaught exception leaves ``cause=user_crash`` behind.

Why: the supervisor does not requeue a crash, and the user then only sees ``FAILED``
and has to dig through per-rank logs. A ``sys.excepthook`` installed by
:func:`hpctrain.runtime.init` writes one record, which the supervisor's verdict and
``hpctrain status`` take the failing rank, node, step and error from::

    cause=user_crash
    exit_code=1
    requeue=0
    step=7
    restart_count=0
    job_id=123
    run_id=0a85...
    rank=1
    node=n2
    error=RuntimeError: --crash-at-step 7: simulated user crash

so ``hpctrain status`` can say why. An exception that carries a ``requeue_cause``
(:class:`hpctrain.errors.StorageUnavailable`: ``storage``) is recorded as that cause with
``requeue=1`` instead: the storage, not the code, failed. Any rank may write it (the crash is often not on
rank 0; the file is on shared storage); the first one wins and a requeue record of the
same run is never overwritten. The hook never raises: a failing write must not hide the
user's traceback, which the previous hook still prints.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from hpctrain.protocol import read_record, write_record
from hpctrain.protocol.records import ExitRecord

ERROR_MAX_CHARS = 300  # one short line: status tables and grep stay readable
# how torch says a collective gave up waiting: gloo's transport, NCCL's watchdog, a store
TIMEOUT_MARKS = ("Timed out waiting", "collective operation timeout", "Socket Timeout",
                 "wait timeout after")
# how torch says a peer left a collective this rank waited in (its connections closed as
# it tore its group down): gloo's transport; NCCL's when a remote rank's process is gone
PEER_MARKS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "remote process exited")

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]


def timed_out(exc: BaseException) -> bool:
    """Did ``exc`` come of a collective that waited for a peer past the collective
    timeout? Then this rank is not the failure but waited for one (a hang elsewhere): the
    record says ``waited=1`` and the supervisor looks for the rank(s) it waited for."""
    return _marked(exc, TIMEOUT_MARKS)


def lost_peer(exc: BaseException) -> bool:
    """Did ``exc`` come of a collective whose peer left it (its connections closed)? Then
    this rank did not fail on its own: a peer crashed, or gave up waiting for a third."""
    return _marked(exc, PEER_MARKS)


def device_lost(exc: BaseException) -> bool:
    """Did ``exc`` come of the device (torch's ``AcceleratorError``: "CUDA error: an illegal
    memory access was encountered", an ECC error, a GPU fallen off the bus)? CUDA's errors
    of that kind are sticky: the process's device context is unusable, so the rank cannot
    start another attempt in it."""
    # by the class's name: this module is imported before (and without) torch
    return any(any(k.__name__ == "AcceleratorError" for k in type(e).__mro__)
               or (isinstance(e, RuntimeError) and str(e).startswith("CUDA error"))
               for e in exception_chain(exc))


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the exceptions it came of (its causes and contexts), once each."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _marked(exc: BaseException, marks: tuple[str, ...]) -> bool:
    """Does ``exc``, or an exception in its chain, say one of ``marks`` as torch's
    RuntimeError?"""
    return any(isinstance(e, RuntimeError) and any(m in str(e) for m in marks)
               for e in exception_chain(exc))


def crash_fields(exc_type: type[BaseException], exc: BaseException, *, step: int | None,
                 restart_count: int, job_id: str | None, rank: int, node: str | None = None,
                 run_id: str | None = None, at_step: int | None = None) -> dict[str, object]:
    """The record's fields for an uncaught exception (one line each). ``step``: the one
    the script said (``ctx.step``); ``at_step``: else the reporter's count of it (the
    checkpoint step resumed from plus the step boundaries since), for the supervisor's
    repeated-crash rule, never shown as the script's step."""
    text = " ".join(str(exc).split())  # newlines and runs of blanks -> one space
    error = f"{exc_type.__name__}: {text}" if text else exc_type.__name__
    # the whole error's digest: what tells two errors apart may lie past the cut below
    digest = hashlib.sha256(error.encode("utf-8", "replace")).hexdigest()[:16]
    if len(error) > ERROR_MAX_CHARS:
        error = error[:ERROR_MAX_CHARS - 3] + "..."
    # an error that is not the training code's fault says which cause it is (duck-typed:
    # hpctrain.errors.StorageUnavailable.requeue_cause = "storage"); the supervisor requeues
    cause = getattr(exc, "requeue_cause", None) or "user_crash"
    fields: dict[str, object] = {
        "cause": cause, "exit_code": 1, "requeue": int(cause != "user_crash"),
        "step": "" if step is None else step, "restart_count": restart_count,
        "job_id": job_id or "", "run_id": run_id or "", "rank": rank, "node": node or "",
        "error": error, "error_digest": digest}
    if step is None and at_step is not None:
        fields["at_step"] = at_step
    if timed_out(exc):
        fields["waited"] = 1
    return fields


def should_write(existing: ExitRecord | None, restart_count: int, job_id: str | None) -> bool:
    """False when this run (same job id and restart count) already left a record:
    a requeue record must survive, and the first crashing rank names the cause."""
    same_run = (existing is not None and existing.restart_count == restart_count
                and existing.job_id == (job_id or ""))
    return not same_run


def write_crash_record(path: str | None, exc_type: type[BaseException], exc: BaseException,
                       *, step: int | None, restart_count: int, job_id: str | None,
                       rank: int, node: str | None = None, run_id: str | None = None,
                       at_step: int | None = None) -> bool:
    """Write the user-crash record unless this run already has one; never raises.
    Returns whether it wrote. ``at_step``: as :func:`crash_fields`."""
    if not path or issubclass(exc_type, KeyboardInterrupt):
        return False
    try:
        if not should_write(ExitRecord.parse(read_record(path)), restart_count, job_id):
            return False
        write_record(path, crash_fields(exc_type, exc, step=step, restart_count=restart_count,
                                        job_id=job_id, rank=rank, node=node, run_id=run_id,
                                        at_step=at_step))
        return True
    except Exception:  # noqa: BLE001 - the user's traceback matters more than our record
        return False


def install_excepthook(record: Callable[[type[BaseException], BaseException], object]) -> None:
    """Chain ``record`` in front of the current ``sys.excepthook`` (which still prints)."""
    previous: ExceptHook = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException,
             tb: TracebackType | None) -> Any:
        try:
            record(exc_type, exc)
        except Exception:  # noqa: BLE001,S110 - never mask the real error
            pass
        return previous(exc_type, exc, tb)

    sys.excepthook = hook
