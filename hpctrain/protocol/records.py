"""The state directory's cross-process records, typed: the runtime's exit record, the
supervisor's verdict and stop notice, and a relay's sign (layout in :mod:`hpctrain.protocol`).

Each crosses a process boundary, often between two versions of hpctrain (a requeued job
may run a newer supervisor over an older record), so the ``key=value`` wire form must not
drift: each record is parsed by its one :meth:`parse` and written through its
:meth:`fields`, and nothing else reads one by key. Like :mod:`hpctrain.protocol.progress`,
a parse is lenient: a count that is not a number reads as unknown (None), not as a broken
record, because a reader must still see the cause beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.protocol.dialog import text


def _int(fields: Mapping[str, object], key: str) -> int | None:
    """Field ``key`` as an integer; None when absent, empty or not one."""
    try:
        return int(text(fields, key))
    except ValueError:
        return None


def _flag(fields: Mapping[str, object], key: str) -> bool | None:
    """A ``1``/``0`` field: True, False, or None when the writer did not say."""
    value = text(fields, key)
    return None if value == "" else value == "1"


def _num(value: int | None) -> str:
    """An optional count as written: '' for unknown."""
    return "" if value is None else str(value)


@dataclass(frozen=True)
class ExitRecord:
    """Why the training processes left (``exit``): a requeue the runtime asked for
    (:meth:`hpctrain.runtime.Context.exit_for_requeue`) or an uncaught exception
    (:mod:`hpctrain.runtime.crashrecord`)."""

    cause: str = ""
    exit_code: int | None = None
    requeue: bool | None = None   # None: the writer did not say (neither asked nor refused)
    step: int | None = None       # the script's step (None: it never said one)
    restart_count: int | None = None
    job_id: str = ""
    run_id: str = ""
    rank: int | None = None       # the crashing rank (crash records only)
    node: str = ""
    error: str = ""               # the exception, one line, cut at 300 characters
    error_digest: str = ""        # a digest of the whole error (what the cut may hide)
    at_step: int | None = None    # the runtime's count of the step, when the script said none
    waited: bool = False          # the rank gave up waiting for a peer in a collective

    @classmethod
    def parse(cls, fields: Mapping[str, object]) -> ExitRecord | None:
        """The record in ``fields``; None when there is none (no field at all)."""
        if not fields:
            return None
        return cls(cause=text(fields, "cause"), exit_code=_int(fields, "exit_code"),
                   requeue=_flag(fields, "requeue"), step=_int(fields, "step"),
                   restart_count=_int(fields, "restart_count"),
                   job_id=text(fields, "job_id"), run_id=text(fields, "run_id"),
                   rank=_int(fields, "rank"), node=text(fields, "node"),
                   error=text(fields, "error"), error_digest=text(fields, "error_digest"),
                   at_step=_int(fields, "at_step"), waited=_flag(fields, "waited") is True)

    def fields(self) -> dict[str, str]:
        """The record as written, in the writers' order (older readers grep it)."""
        out = {"cause": self.cause, "exit_code": _num(self.exit_code),
               "requeue": "" if self.requeue is None else str(int(self.requeue)),
               "step": _num(self.step), "restart_count": _num(self.restart_count),
               "job_id": self.job_id, "run_id": self.run_id}
        if self.rank is not None:
            out["rank"] = str(self.rank)
        out["node"] = self.node
        if self.error:
            out.update(error=self.error, error_digest=self.error_digest)
        if self.at_step is not None:
            out["at_step"] = str(self.at_step)
        if self.waited:
            out["waited"] = "1"
        return out

    @property
    def asks_requeue(self) -> str | None:
        """The requeue cause the runtime asked for (preemption, time_limit, or storage:
        the checkpoint storage was unavailable); None when it asked none."""
        if self.requeue and self.cause in ("preemption", "time_limit", "storage"):
            return self.cause
        return None

    @property
    def crash_step(self) -> int | None:
        """The step the record places a crash at: the script's own, else the runtime's
        count (the checkpoint step resumed from plus the boundaries since)."""
        for step in (self.step, self.at_step):
            if step is not None and step >= 0:
                return step
        return None


@dataclass(frozen=True)
class Verdict:
    """The supervisor's verdict on a run (``outcome``): what it decided and why, which
    ``hpctrain status`` and ``report`` show and the next run's supervisor reads back."""

    cause: str = ""
    action: str = ""
    run_id: str = ""
    restart_count: int | None = None
    job: str = ""
    status: int | None = None     # the step's exit status (None: no step ended)
    step: int | None = None       # the step the runtime said it reached
    limit: str = ""
    why: str = ""
    detail: str = ""
    attempt: int | None = None    # an in-place restart's attempt
    mode: str = ""                # ...``inprocess`` when in the running processes
    at: float | None = None       # when (epoch seconds)
    failure: str | None = None    # the run's first failure, when diagnosed (then the next:)
    rank: int | None = None
    node: str = ""                # the failure's node; else the nodes a health check failed
    error: str = ""

    @classmethod
    def parse(cls, fields: Mapping[str, object]) -> Verdict | None:
        """The verdict in ``fields``; None when there is none (no field at all)."""
        if not fields:
            return None
        at = _int(fields, "at")
        return cls(cause=text(fields, "cause"), action=text(fields, "action"),
                   run_id=text(fields, "run_id"),
                   restart_count=_int(fields, "restart_count"), job=text(fields, "job"),
                   status=_int(fields, "status"), step=_int(fields, "step"),
                   limit=text(fields, "limit"), why=text(fields, "why"),
                   detail=text(fields, "detail"), attempt=_int(fields, "attempt"),
                   mode=text(fields, "mode"), at=None if at is None else float(at),
                   failure=text(fields, "failure") if "failure" in fields else None,
                   rank=_int(fields, "rank"), node=text(fields, "node"),
                   error=text(fields, "error"))

    def fields(self) -> dict[str, str]:
        """The record as the supervisor writes it: every verdict's fields, an in-place
        restart's attempt (and mode), a failed health check's nodes, then the time, then
        a diagnosed failure's rank, node, error and text."""
        out = {"run_id": self.run_id} if self.run_id else {}
        out.update(cause=self.cause, action=self.action,
                   restart_count=_num(self.restart_count), job=self.job,
                   status=_num(self.status), step=_num(self.step), limit=self.limit,
                   why=self.why, detail=self.detail)
        if self.attempt is not None:
            out["attempt"] = str(self.attempt)
        if self.mode:
            out["mode"] = self.mode
        if self.failure is None and self.node:
            out["node"] = self.node
        if self.at is not None:
            out["at"] = f"{self.at:.0f}"
        if self.failure is not None:
            out.update(rank=_num(self.rank), node=self.node, error=self.error,
                       failure=self.failure)
        return out


@dataclass(frozen=True)
class StopNotice:
    """The supervisor's word to the ranks on a stop signal it passes on (``stop``): why
    the signal came (preemption or time_limit), since a rank cannot ask Slurm itself."""

    cause: str
    restart_count: int | None = None
    signal: str = ""              # the signal caught, without SIG
    run_id: str = ""

    @classmethod
    def parse(cls, fields: Mapping[str, object]) -> StopNotice | None:
        """The notice in ``fields``; None when there is none (no cause)."""
        if not text(fields, "cause"):
            return None
        return cls(text(fields, "cause"), _int(fields, "restart_count"),
                   text(fields, "signal"), text(fields, "run_id"))

    def fields(self) -> dict[str, str]:
        out = {"run_id": self.run_id} if self.run_id else {}
        out.update(cause=self.cause, restart_count=_num(self.restart_count),
                   signal=self.signal)
        return out


@dataclass(frozen=True)
class Sign:
    """A node's relay's sign that its ranks send progress datagrams, and where to
    (``channel/r<restart>-<node>``): the supervisor reads it only when none arrive, to
    tell a blocked network from a script that never sends."""

    node: str = ""
    host: str = ""
    port: int | None = None
    pid: int | None = None
    beat_s: str = ""              # as the relay wrote it (``2``, ``0.5``)
    error: str = ""               # why sending failed ('' when it did not)

    @classmethod
    def parse(cls, fields: Mapping[str, object]) -> Sign | None:
        """The sign in ``fields``; None when there is none (no field at all)."""
        if not fields:
            return None
        return cls(text(fields, "node"), text(fields, "host"), _int(fields, "port"),
                   _int(fields, "pid"), text(fields, "beat_s"), text(fields, "error"))

    def fields(self) -> dict[str, str]:
        return {"node": self.node, "host": self.host, "port": _num(self.port),
                "pid": _num(self.pid), "beat_s": self.beat_s, "error": self.error}


@dataclass(frozen=True)
class Identity:
    """Who owns a job's state directory (``identity``): the job run's id every other record
    carries, the cluster, the job key and the submission, and when it was made."""

    run_id: str
    job: str = ""
    cluster: str = ""
    submission: str = ""
    created: str = ""             # epoch seconds, as written

    @classmethod
    def parse(cls, fields: Mapping[str, object]) -> Identity | None:
        """The identity in ``fields``; None when there is none (no run id)."""
        if not text(fields, "run_id"):
            return None
        return cls(text(fields, "run_id"), text(fields, "job"), text(fields, "cluster"),
                   text(fields, "submission"), text(fields, "created"))

    def fields(self) -> dict[str, str]:
        return {"run_id": self.run_id, "job": self.job, "cluster": self.cluster,
                "submission": self.submission, "created": self.created}


def of_run(record: ExitRecord | Verdict | StopNotice | None, run_id: str | None,
           restart_count: int | None = None) -> bool:
    """Was ``record`` written by this job (its run_id) and, if given, by this run? The one
    rule every reader of a per-run record uses."""
    if record is None or (run_id and record.run_id != run_id):
        return False
    return restart_count is None or record.restart_count == restart_count
