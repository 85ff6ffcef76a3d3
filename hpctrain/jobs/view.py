"""The one view of a job: what Slurm says, completed by what the job's own files say.

Slurm (one batched :func:`hpctrain.jobs.poll.snapshot`) is the source of truth for the
state; the job's state directory adds detail Slurm does not keep (requeue causes from the
supervisor's ledger, its verdict on the last run, live progress) and the checkpoint dir
the last saved step. :meth:`Job.info <hpctrain.jobs.handle.Job.info>`, ``hpctrain status``
and ``submit --wait`` all build their view here. Plain file reads and, for a running job,
one datagram to its supervisor (:mod:`hpctrain.protocol.live`; the summary file when it
does not answer): no torch, no extra Slurm call.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from hpctrain import protocol
from hpctrain.jobs import statedir
from hpctrain.jobs.index import JobEntry
from hpctrain.jobs.poll import JobInfo, Snapshot, ended_without_accounting, last_checkpoint_step
from hpctrain.jobs.statedir import state_dirs
from hpctrain.protocol import live
from hpctrain.protocol.ledger import Ledger, requeues_by_cause
from hpctrain.protocol.progress import Progress
from hpctrain.protocol.records import Identity, Verdict
from hpctrain.slurm.states import by_name



def run_id_of(identity: Identity | None) -> str:
    """The job run's id its state directory's identity names ('' without one)."""
    return identity.run_id if identity is not None else ""

def slurm_info(job_id: str, entry: JobEntry, snap: Snapshot) -> JobInfo:
    """Slurm's word on ``job_id`` from ``snap``; without accounting, a job that left the
    queue has ended (its folder says whether it left a result)."""
    if job_id in snap.infos:
        return snap.infos[job_id]
    if snap.source == "squeue":
        return ended_without_accounting(job_id, entry.folder)
    return snap.get(job_id)


@dataclass
class JobStatus:
    """A job as ``hpctrain status`` shows it: Slurm's info (requeue causes completed by the
    ledger) and what the job's state directory and checkpoint dir add."""

    job_id: str
    entry: JobEntry
    info: JobInfo
    ledger: Ledger | None = None
    verdict: Verdict | None = None                           # the supervisor's outcome record
    last_step: int | None = None
    live: str = ""            # rank 0's progress line (the last one once it stopped)
    progress_source: str = ""    # where it came from: "supervisor" (asked now), "summary"
    progress_step: int | None = None                         # ...and its step
    run_id: str = ""                                         # HPCTRAIN_RUN_ID, once it ran
    point: dict[str, str] | None = None                      # a sweep task's overrides

    @property
    def requeue_limit(self) -> str | None:
        return self.ledger.limit if self.ledger is not None else None

    @property
    def restarts_in_place(self) -> dict[str, int]:
        return self.ledger.restarts if self.ledger is not None else {}

    @property
    def restarts_in_process(self) -> dict[str, int]:
        """Of :attr:`restarts_in_place`, those in the running processes (runtime.run)."""
        return self.ledger.inprocess if self.ledger is not None else {}

    @property
    def excluded_nodes(self) -> dict[str, str]:
        return self.ledger.excluded if self.ledger is not None else {}

    @property
    def slow_nodes(self) -> dict[str, float]:
        """Nodes found slow, with their factor ("-": the whole job slowed)."""
        return self.ledger.slow if self.ledger is not None else {}

    @property
    def shrunk(self) -> tuple[int, int] | None:
        """(GPUs now, at full width) while the job runs shrunk ([elastic] min_nodes); None
        once it ended or waits to run again (its next start asks for the full size)."""
        running = str(self.info.state) in ("RUNNING", "COMPLETING")
        return self.ledger.shrunk if self.ledger is not None and running else None

    @property
    def hangs(self) -> int:
        return self.ledger.recoveries("hang") if self.ledger is not None else 0

    def to_json(self) -> dict[str, Any]:
        """One job of ``hpctrain status --json``."""
        out = {"job_id": self.job_id, "name": self.info.name or self.entry.name,
               "kind": self.entry.kind, **info_json(self.info),
               "requeue_limit": self.requeue_limit,
               "restarts_in_place": self.restarts_in_place,
               "restarts_in_process": self.restarts_in_process,
               "excluded_nodes": self.excluded_nodes, "slow_nodes": self.slow_nodes,
               "shrunk": list(self.shrunk) if self.shrunk else None,
               "progress": self.live,
               "progress_source": self.progress_source, "progress_step": self.progress_step,
               "hangs": self.hangs, "last_checkpoint_step": self.last_step,
               "folder": self.entry.folder, "cause": self.verdict.cause if self.verdict else None,
               "verdict": self.verdict.fields() if self.verdict else {}, "run_id": self.run_id,
               "snapshot": self.entry.extra.get("snapshot", "")}
        if self.point is not None:
            out["point"] = self.point
        return out


def info_json(info: JobInfo) -> dict[str, Any]:
    """Slurm's part of the view, as ``status --json`` and ``submit --wait --json`` print it."""
    return {"state": str(info.state), "slurm_state": info.slurm_state,
            "outcome": info.state.outcome.value, "elapsed_s": info.elapsed_s,
            "nodes": info.nodes, "num_nodes": info.num_nodes, "exit_code": info.exit_code,
            "reason": info.reason, "requeues": info.requeues}


def info_from_json(job_id: str, data: dict[str, Any]) -> JobInfo:
    """A :class:`JobInfo` back from :func:`info_json`'s object (a ``--host`` job's view)."""
    return JobInfo(job_id=job_id, state=by_name(str(data.get("state", ""))),
                   slurm_state=data.get("slurm_state") or "", name=data.get("name") or "",
                   elapsed_s=data.get("elapsed_s"), nodes=data.get("nodes") or "",
                   num_nodes=int(data.get("num_nodes") or 0),
                   exit_code=data.get("exit_code") or "", reason=data.get("reason") or "",
                   requeues=dict(data.get("requeues") or {}))


def job_status(job_id: str, entry: JobEntry, snap: Snapshot, *, details: bool = True,
               ask: bool = True) -> JobStatus:
    """The view of ``job_id``; ``details=False`` stops at Slurm's info and the ledger
    (what :meth:`Job.info` needs), skipping the verdict, checkpoint and progress reads;
    ``ask=False`` leaves the progress to the caller (:func:`fill_progress`, many at once)."""
    dirs = state_dirs(entry)
    info = slurm_info(job_id, entry, snap)
    ledger = statedir.ledger(job_id, entry)
    info = replace(info, requeues=requeues_by_cause(info.requeues, ledger))
    if not details:
        return JobStatus(job_id, entry, info, ledger)
    view = JobStatus(job_id, entry, info, ledger,
                     verdict=Verdict.parse(protocol.find_record(job_id, protocol.OUTCOME,
                                                                *dirs)),
                     run_id=run_id_of(Identity.parse(protocol.find_record(
                         job_id, protocol.IDENTITY, *dirs))),
                     last_step=last_checkpoint_step(entry.checkpoint_dir))
    if ask:
        fill_progress([view])
    return view


def fill_progress(views: Iterable[JobStatus]) -> None:
    """The progress of ``views``: a running job's supervisor asked (all at once, one
    datagram each: :func:`hpctrain.protocol.live.ask`), the summary file for those that do
    not answer and for a job not running now (the step a finished job ended at, or where a
    requeued one stopped)."""
    found = []
    for view in views:
        state = protocol.find_state_dir(view.job_id, *state_dirs(view.entry))
        if state is not None:
            running = str(view.info.state) == "RUNNING"
            found.append((view, state, live.read_address(state) if running else None))
    answers = live.ask([a for _, _, a in found if a is not None])
    for view, state, address in found:
        shown = progress_of(state, answers.get(address.key) if address is not None else None,
                            running=str(view.info.state) == "RUNNING")
        view.live, view.progress_source, view.progress_step = shown.line, shown.source, \
            shown.step


def wait_progress(job_id: str, entry: JobEntry, running: bool = True
                  ) -> tuple[str, int | None]:
    """What ``submit --wait`` adds to Slurm's word: the progress line ('' when there is
    none) and the last checkpoint step. ``running=False`` (the job has ended): the final
    summary, without asking a supervisor that is gone."""
    state = protocol.find_state_dir(job_id, *state_dirs(entry))
    line = ""
    if state is not None:
        address = live.read_address(state) if running else None
        answer = live.ask([address]).get(address.key) if address is not None else None
        line = progress_of(state, answer, running).line
    return line, last_checkpoint_step(entry.checkpoint_dir)


@dataclass(frozen=True)
class Shown:
    """A job's progress as shown: the line, where it came from, its step."""

    line: str = ""
    source: str = ""         # "supervisor" | "summary" | "" (none)
    step: int | None = None


def progress_of(state: Path, answer: live.Answer | None, running: bool = True) -> Shown:
    """``step 17 (training, 3.2 steps/s, 26,214 tokens/s)`` from rank 0's progress record
    (the supervisor's ``answer``, else the summary file it writes) and, ``running``, the
    rate from the tail of its history (a job using hpctrain.runtime; tokens or samples
    when the script said a step's work); an empty :class:`Shown` without one."""
    record, source = None, ""
    if answer is not None and answer.record:
        record, source = Progress.parse(answer.record), "supervisor"
    if record is None:
        record, source = Progress.parse(protocol.read_record(state / protocol.SUMMARY)), \
            "summary"
    if record is None:
        return Shown()
    run = (record.address.restart_count, record.address.attempt)
    steps = [e for e in protocol.read_history(state, tail_bytes=8192)
             if e.get("event") == "step" and (e.get("restart"), e.get("attempt")) == run
             ] if running else []
    rate = ""
    if len(steps) >= 2 and steps[-1]["t"] > steps[0]["t"]:
        per_s = (len(steps) - 1) / (steps[-1]["t"] - steps[0]["t"])
        rate = f", {per_s:.2f} steps/s"
        if record.work is not None:     # the script said a step's work (ctx.set_work)
            rate += f", {per_s * record.work.per_step:,.0f} {record.work.unit}/s"
    shown = record.step or str(record.boundaries)
    return Shown(f"step {shown} ({record.phase}{rate})", source,
                 int(shown) if shown.isdigit() else None)
