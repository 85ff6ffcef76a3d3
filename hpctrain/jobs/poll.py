"""Job states for many jobs in ONE batched Slurm call.

``snapshot(ids)`` asks ``sacct`` once for every job (``-D`` keeps earlier runs of requeued
jobs, which is where requeue counts by cause come from). Where accounting is not
available (no ``sacct``, or "accounting storage is disabled") it falls back to one
``squeue`` call plus the job folders, and says so in :attr:`Snapshot.note`.

Every Slurm state goes through :func:`hpctrain.slurm.states.from_slurm`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from hpctrain.errors import SlurmError, SlurmNotFound
from hpctrain.protocol.ckptlayout import read_latest
from hpctrain.slurm import client
from hpctrain.slurm.parse import (SQUEUE_FORMAT, parse_elapsed, parse_sacct_parsable2,
                                  parse_squeue, resized)
from hpctrain.slurm.states import ENDED, UNKNOWN, State, from_slurm

SACCT_FIELDS = ("JobID", "JobIDRaw", "State", "Elapsed", "Start", "End", "NodeList",
                "AllocNodes", "ExitCode", "Reason", "JobName")
# sacct answers like this when the cluster keeps no accounting
NO_ACCOUNTING = ("accounting storage is disabled", "slurmdbd", "Connection refused")


@dataclass
class JobInfo:
    """One job (or one array task) as Slurm last reported it."""

    job_id: str                 # "123", or "123_4" for an array task
    state: State
    slurm_state: str = ""
    name: str = ""
    elapsed_s: int | None = None
    nodes: str = ""
    num_nodes: int = 0
    exit_code: str = ""
    reason: str = ""
    start: str = ""
    end: str = ""
    requeues: dict[str, int] = field(default_factory=dict)   # cause -> count
    raw_id: str = ""            # Slurm's own id of this job/task (an array task's %j)


@dataclass
class Snapshot:
    """The answer of one poll: infos by job id, where they came from, and any caveat."""

    infos: dict[str, JobInfo]
    source: str                 # "sacct" | "squeue"
    note: str = ""
    calls: int = 0              # Slurm commands run for this snapshot

    def get(self, job_id: str) -> JobInfo:
        return self.infos.get(job_id) or JobInfo(job_id, UNKNOWN)


_PENDING_RANGE = re.compile(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]$")


def _expand_ids(job_id: str) -> list[str]:
    """``123_[0-3,7%2]`` (a pending array's tasks in one line) -> ``123_0 ... 123_7``."""
    m = _PENDING_RANGE.match(job_id)
    if not m:
        return [job_id]
    out = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        out += [f"{m.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def infos_from_sacct(rows: Iterable[dict[str, str]]) -> dict[str, JobInfo]:
    """Fold ``sacct -X -D`` rows (oldest first) into one JobInfo per job id.

    Every run but the last ended in a state whose cause counts as one requeue. A resize
    is not a run (:func:`hpctrain.slurm.parse.resized`): a lost node was taken from the
    running job ([elastic] spare nodes) and the run went on. The name is the newest that
    is not Slurm's placeholder (:data:`UNNAMED`).
    """
    runs: dict[str, list[dict[str, str]]] = {}
    for rec in rows:
        for jid in _expand_ids(rec.get("JobID", "")):
            if jid and "." not in jid:
                runs.setdefault(jid, []).append(rec)
    infos = {}
    for jid, recs in runs.items():
        last = recs[-1]
        requeues: dict[str, int] = {}
        for earlier, following in zip(recs, recs[1:]):
            if resized(earlier, following):
                continue
            cause = from_slurm(earlier["State"]).cause or "requeued"
            requeues[cause] = requeues.get(cause, 0) + 1
        state = from_slurm(last.get("State", ""))
        if requeues and state.name == "PENDING":
            # waiting to run again after an interruption: say so, not just "PENDING"
            state = from_slurm("REQUEUED")
        infos[jid] = JobInfo(
            job_id=jid, state=state, slurm_state=last.get("State", ""),
            name=_job_name(recs), elapsed_s=parse_elapsed(last.get("Elapsed", "")),
            nodes=_none_to_empty(last.get("NodeList", "")),
            num_nodes=int(last.get("AllocNodes") or 0), exit_code=last.get("ExitCode", ""),
            reason=_none_to_empty(last.get("Reason", "")), start=last.get("Start", ""),
            end=last.get("End", ""), requeues=requeues,
            raw_id=last.get("JobIDRaw", "") if "[" not in last.get("JobID", "") else "")
    return infos


def infos_from_squeue(rows: Iterable[dict[str, str]]) -> dict[str, JobInfo]:
    """squeue rows -> JobInfo (no requeue history: squeue does not keep it)."""
    infos = {}
    for rec in rows:
        jid = rec["JobID"]
        infos[jid] = JobInfo(
            job_id=jid, state=from_slurm(rec["State"]), slurm_state=rec["State"],
            name=rec["JobName"], elapsed_s=parse_elapsed(rec["Elapsed"]),
            nodes=_none_to_empty(rec["NodeList"]),
            num_nodes=int(rec["AllocNodes"]) if rec["AllocNodes"].isdigit() else 0,
            reason=_none_to_empty(rec["Reason"]), raw_id=rec["JobIDRaw"])
    return infos


# What slurmdbd records as the name of a run whose job came to it without one. A requeued
# run's row can carry it although the job kept its name: seen once on the devcluster, a
# job submitted as "victim", preempted and requeued, then shown as "allocation".
UNNAMED = "allocation"


def _job_name(recs: Sequence[dict[str, str]]) -> str:
    """The newest run's name, or an earlier run's where slurmdbd wrote its placeholder."""
    names = [rec.get("JobName", "") for rec in recs]
    return next((n for n in reversed(names) if n and n != UNNAMED), names[-1])


def _none_to_empty(value: str) -> str:
    return "" if value in ("None", "None assigned", "(null)") else value


def snapshot(job_ids: Sequence[str], *, use_sacct: bool = True) -> Snapshot:
    """States of many jobs with ONE Slurm call (two without accounting).

    ``job_ids`` are plain job ids or array job ids; an array id returns all its tasks.
    """
    bases = sorted({j.split("_")[0] for j in job_ids}, key=lambda j: (len(j), j))
    if not bases:
        return Snapshot({}, "sacct")
    note = ""
    if use_sacct:
        try:
            res = client.run(["sacct", "-X", "-D", "--parsable2", "-j", ",".join(bases),
                              "-o", ",".join(SACCT_FIELDS)])
            infos = infos_from_sacct(parse_sacct_parsable2(res.stdout))
            # A job submitted a moment ago may not have reached the accounting database
            # yet: ask squeue about those (only those, only then).
            seen = {k.split("_")[0] for k in infos}
            missing = [b for b in bases if b not in seen]
            if missing:
                infos.update(squeue_infos(missing))
            return Snapshot(infos, "sacct", calls=1 + bool(missing))
        except SlurmNotFound:
            note = "sacct is not installed here: states from squeue and the job folders"
        except SlurmError as exc:
            if not any(m in str(exc) for m in NO_ACCOUNTING):
                raise
            note = ("Slurm accounting is unavailable (sacct: "
                    f"{str(exc).splitlines()[0]}): states from squeue and the job folders")
    else:
        note = "sacct not used: states from squeue and the job folders"
    return Snapshot(squeue_infos(bases), "squeue", note, calls=1)


def squeue_infos(bases: Sequence[str]) -> dict[str, JobInfo]:
    """One ``squeue`` call for the given job ids (array tasks expanded)."""
    res = client.run(["squeue", "-h", "-r", "-j", ",".join(bases), "-o", SQUEUE_FORMAT],
                     check=False)
    # squeue exits 1 with "Invalid job id" once every listed job has left the queue
    return infos_from_squeue(parse_squeue(res.stdout)) if res.returncode == 0 else {}


def queued_ids(job_ids: Sequence[str]) -> set[str]:
    """Which of these jobs Slurm still has in its queue (one squeue call)."""
    bases = sorted({j.split("_")[0] for j in job_ids})
    return set(squeue_infos(bases)) if bases else set()


def ended_without_accounting(job_id: str, folder: str | None) -> JobInfo:
    """A job absent from squeue while sacct is unavailable: it ended; say what the folder knows."""
    info = JobInfo(job_id, ENDED, slurm_state="")
    if folder:
        results = list(Path(folder).glob(f"{job_id}_*_result.pkl"))
        info.reason = "result file present" if results else "no result file"
    return info


def last_checkpoint_step(checkpoint_dir: str) -> int | None:
    """The newest checkpoint step in a checkpoint dir, read from plain files (no torch):
    the step its ``latest`` pointer names, in the layout hpctrain.checkpoint writes
    (:mod:`hpctrain.protocol.ckptlayout`); None without one."""
    return read_latest(checkpoint_dir) if checkpoint_dir else None
