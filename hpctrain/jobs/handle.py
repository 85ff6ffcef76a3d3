"""The handle on a submitted job: ``job_id``, ``state``, ``wait()``, ``logs()``, ``cancel()``, ``result()``.

A :class:`Job` is built from its entry in the local index (``hpctrain.jobs.index``), so it works
the same from the submitting notebook, from another shell (``Job.attach("123")``) and
from the CLI. States come from one batched poll (``hpctrain.jobs.poll``); results of
function jobs from submitit's result files (:mod:`hpctrain.jobs.results`). It keeps the
contract every job handle keeps (:class:`~hpctrain.jobs.contract.JobHandle`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from hpctrain.errors import JobError, SlurmError
from hpctrain.jobs import index, poll, statedir
from hpctrain.jobs.contract import POLL_S, JobHandle, Update, backoff, is_over
from hpctrain.jobs.ids import check_job_id
from hpctrain.jobs.index import JobEntry
from hpctrain.jobs.poll import JobInfo
from hpctrain.jobs.results import RESULT_WAIT_S, decode_results, read_result_files
from hpctrain.jobs.view import job_status
from hpctrain.slurm import client
from hpctrain.slurm.parse import parse_sbatch_directives


class Job(JobHandle):
    """A submitted hpctrain job (or one task of a sweep array: ``123_4``)."""

    cancel_hint = "`hpctrain cancel` it"

    def __init__(self, entry: JobEntry, task: str | None = None,
                 submitit_job: Any = None) -> None:
        self.entry = entry
        self.job_id = f"{entry.job_id}_{task}" if task is not None else entry.job_id
        self._submitit_job = submitit_job

    @classmethod
    def attach(cls, job_id: str) -> "Job":
        """The handle of a job submitted earlier through hpctrain (from the local index)."""
        check_job_id(job_id)
        rec = statedir.entry_of(job_id)
        if rec is None:
            raise JobError(f"job {job_id} is not in hpctrain's job index ({index.index_path()}): "
                           "pass a job id that `hpctrain status` lists")
        task = job_id.split("_", 1)[1] if "_" in job_id else None
        return cls(rec, task)

    def __repr__(self) -> str:
        return f"Job(job_id={self.job_id!r}, name={self.name!r})"

    @property
    def record(self) -> JobEntry:
        """The index entry (the name before 0.2; use :attr:`entry`)."""
        return self.entry

    @property
    def name(self) -> str:
        return self.entry.name

    # ---- state ------------------------------------------------------------------------
    def info(self) -> JobInfo:
        """What Slurm says now (one sacct call; squeue and the job folder without sacct),
        with requeue causes from the supervisor's ledger (plain file reads)."""
        return job_status(self.job_id, self.entry, poll.snapshot([self.job_id]),
                          details=False).info

    def over(self, info: JobInfo) -> bool:
        """Has the job ended for good, ``info`` being what Slurm says now? (One squeue
        call for an interruption: was the job requeued?)"""
        return is_over(info, lambda: self.job_id in poll.queued_ids([self.job_id]))

    def done(self) -> bool:
        return self.over(self.info())

    def updates(self, poll_s: float = POLL_S, timeout_s: float | None = None,
                idle: Callable[[float], None] | None = None) -> Iterator[Update]:
        """(info, over) now and after each pause (``idle`` waits: time.sleep by default),
        until the job has ended for good. The pause is ``poll_s`` after a change of state
        or requeues, and grows by half each unchanged poll up to MAX_POLL_S (``backoff``,
        shared with ``status --watch``). Endless until then: the waiter keeps the time
        (``timeout_s``)."""
        pause, seen = poll_s, None
        while True:
            info = self.info()
            over = self.over(info)
            yield info, over
            if over:
                return
            now = (info.slurm_state, sum(info.requeues.values()))
            pause = backoff(pause, poll_s, now != seen)
            seen = now
            (idle or time.sleep)(pause)

    # ---- files ------------------------------------------------------------------------
    @property
    def folder(self) -> str:
        """The job folder (submission file, pickles, results)."""
        return self.entry.folder

    @property
    def submission_file(self) -> Path:
        """The script Slurm ran (submitit's ``<id>_submission.sh``)."""
        return Path(self.folder) / f"{self.entry.job_id}_submission.sh"

    def log_path(self, rank: int | None = None, raw_id: str | None = None) -> Path:
        """The log file of the job, or of one rank when ranks have their own files."""
        pattern = self.entry.rank_log if (rank is not None and self.entry.rank_log) \
            else self.entry.log
        return Path(expand_pattern(pattern, self.job_id, rank, self.name, raw_id))

    def _readable_log(self, rank: int | None) -> Path:
        if not self.entry.log:
            # an entry written by hand or by a tool that left it out: Path("") is the cwd
            raise JobError(f"job {self.job_id}: the job index has no log path for it; look "
                           f"in its job folder {self.folder} or Slurm's StdOut "
                           f"(`scontrol show job {self.job_id}`)")
        return self.log_path(rank, self._raw_id())

    def logs(self, rank: int | None = None) -> str:
        """The job's output so far ('' before it starts)."""
        path = self._readable_log(rank)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return filter_rank(text, rank) if rank is not None and not self.entry.rank_log else text

    def follow(self, rank: int | None = None, poll_s: float = 0.5,
               stop_when_done: bool = True,
               idle: Callable[[float], None] = time.sleep) -> Iterator[str]:
        """Yield the log's lines as they are written, until the job has ended. ``idle``
        waits between polls (the CLI's also notices that its reader has gone)."""
        path = self._readable_log(rank)
        pos, partial, last_check = 0, "", 0.0
        while True:
            chunk = ""
            if path.exists():
                with path.open("r", encoding="utf-8", errors="replace") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
                    pos = fh.tell()
            if chunk:
                lines = (partial + chunk).split("\n")
                partial = lines.pop()
                for line in lines:
                    if rank is None or self.entry.rank_log or line_rank(line) in (None, rank):
                        yield line
                continue
            now = time.monotonic()
            if stop_when_done and now - last_check > 2.0:
                last_check = now
                if self.done():
                    if partial:
                        yield partial
                    return
            idle(poll_s)

    def _raw_id(self) -> str | None:
        if "_" not in self.job_id:
            return None
        return poll.snapshot([self.job_id]).get(self.job_id).raw_id or None

    # ---- control ----------------------------------------------------------------------
    def cancel(self) -> None:
        """Cancel the job (scancel); cancelling an ended job is not an error, one Slurm
        has no trace of is (:class:`JobError`)."""
        done = cancel([self.job_id])
        if done.unknown:
            raise JobError(f"job {self.job_id}: Slurm has no such job (neither queued nor "
                           "in its accounting): nothing was cancelled")

    def result(self, timeout_s: float | None = None) -> Any:
        """The callable's return value; a list of per-rank values for multi-task jobs.

        Raises JobError for script jobs (they have logs, not results) and when the job
        did not complete, with the job's own traceback when it raised.
        """
        if self.entry.kind != "function":
            raise JobError(f"job {self.job_id} runs a script, not a Python callable: it has no "
                           "result; read its output with job.logs() / `hpctrain logs`")
        info = self.wait(timeout_s=timeout_s)
        blobs = read_result_files(self.folder, self.entry.job_id, self.entry.num_tasks,
                                  wait_s=RESULT_WAIT_S)
        return decode_results(self.job_id, info.state, blobs, f"`hpctrain logs {self.job_id}`")


@dataclass(frozen=True)
class Cancelled:
    """What ``cancel`` did, by job id: asked Slurm to end the ones still queued or running,
    found others ended already, and found no trace of the rest (scancel says nothing of
    an unknown id unless asked to be verbose, and exits 0: Slurm's queue and accounting
    are asked instead)."""

    cancelled: tuple[str, ...]
    ended: tuple[str, ...]
    unknown: tuple[str, ...]
    note: str = ""      # no accounting: an id not in the queue may have ended or never been


def cancel(job_ids: list[str]) -> Cancelled:
    """scancel the given jobs in one call, after one batched look at what Slurm knows of
    them (:func:`hpctrain.jobs.poll.snapshot`)."""
    if not job_ids:
        return Cancelled((), (), ())
    snap = poll.snapshot(job_ids)
    # is any of its rows (a job, an array's tasks, a task by Slurm's own id) still active?
    running: dict[str, bool] = {}
    for key, info in snap.infos.items():
        for name in {key, key.split("_")[0], info.raw_id} - {""}:
            running[name] = running.get(name, False) or not info.state.final
    active = tuple(j for j in job_ids if running.get(j))
    ended = tuple(j for j in job_ids if running.get(j) is False)
    unknown = tuple(j for j in job_ids if j not in running)
    note = ""
    if snap.source != "sacct" and unknown:
        ended, unknown = (*ended, *unknown), ()
        note = f"{snap.note}; not in the queue: ended, or no such job"
    # the unknown ones too: accounting with PrivateData hides other users' jobs, and only
    # scancel then says it is another user's (silent, exit 0, for an id it does not know)
    targets = (*active, *unknown)
    if targets:
        try:
            client.run(["scancel", *targets])
        except SlurmError as exc:
            text = str(exc)
            if "Access/permission denied" in text:
                # another user's job: Slurm's own words, and who may do it
                raise SlurmError(f"Slurm refused to cancel {' '.join(targets)}: "
                                 "Access/permission denied (only the job's owner, an "
                                 "operator or root may cancel a job; `squeue -j ID -o %u` "
                                 "names the owner)") from None
            # one that ended between the look and the scancel
            if "Invalid job id" not in text and "already complet" not in text:
                raise
    return Cancelled(active, ended, unknown, note)


def line_rank(line: str) -> int | None:
    """The rank of a line labelled by ``srun --label`` (``3: text``), else None."""
    head, sep, _ = line.partition(":")
    head = head.strip()
    return int(head) if sep and head.isdigit() else None


def filter_rank(text: str, rank: int) -> str:
    """The lines of one rank from a log shared by all ranks (``srun --label`` prefixes)."""
    lines = text.splitlines(keepends=True)
    labelled = [ln for ln in lines if line_rank(ln) is not None]
    if not labelled:
        return text  # unlabelled output: cannot tell ranks apart, show all of it
    return "".join(ln for ln in lines if line_rank(ln) in (None, rank))


@dataclass(frozen=True)
class LogPaths:
    """Where a job's output goes, as patterns (%j/%A/%a/%t/%x unexpanded)."""

    log: str        # the batch log (every rank's output when ranks share it)
    rank_log: str   # per-rank files ("" when the ranks share the batch log)


def log_paths(script: str, cwd: str | os.PathLike[str], array: bool = False) -> LogPaths:
    """The log file a rendered script writes, from its ``--output`` directive.

    Without one Slurm writes ``slurm-%j.out`` (``slurm-%A_%a.out`` for arrays) in the
    job's working directory: ``--chdir`` or the directory sbatch ran in.
    """
    d = parse_sbatch_directives(script)
    workdir = Path(d.get("chdir") or d.get("D") or cwd)
    out = d.get("output") or d.get("o") or ("slurm-%A_%a.out" if array else "slurm-%j.out")
    path = Path(out) if os.path.isabs(out) else workdir / out
    return LogPaths(str(path), "")


def expand_pattern(pattern: str, job_id: str, task: int | None = None, name: str = "",
                   raw_id: str | None = None) -> str:
    """Expand Slurm's filename patterns (%j %A %a %t %x %%) for one job or array task.

    ``job_id`` is ``123`` or ``123_4``; an array task's ``%j`` is its own raw job id
    (``raw_id``, from sacct/squeue). Unknown letters stay as they are.
    """
    base, _, index = job_id.partition("_")
    subst = {"j": raw_id or base, "A": base, "a": index or "0",
             "t": str(task or 0), "x": name, "%": "%"}
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern) and pattern[i + 1] in subst:
            out.append(subst[pattern[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)
