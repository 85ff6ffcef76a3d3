"""A partition over a period, for its sysadmins: requeues by cause, GPU-hours and goodput
per account, and how long emergency saves took against the partition's GraceTime. Pure:
``hpctrain report --partition`` gathers sacct's runs and the histories it can read.

sacct names how a run ended (PREEMPTED, TIMEOUT, NODE_FAIL, REQUEUED); for jobs whose
state directory is readable (the caller's own hpctrain jobs) the ledger names the cause
of every requeue instead (sacct says only REQUEUED for the supervisor's). Goodput is
known only for jobs with a progress history; the others count as "unknown".
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpctrain.report.build import Report

RUN_CAUSE = {"PREEMPTED": "preemption", "TIMEOUT": "time_limit", "NODE_FAIL": "node_fail",
             "REQUEUED": "requeued"}


@dataclass(frozen=True)
class RunRow:
    """One run of one job of the partition, as sacct listed it."""

    job: str          # the job key (123, 120_4)
    account: str
    state: str
    elapsed_s: float
    gpus: int


@dataclass
class PartitionReport:
    partition: str
    since: str
    jobs: int
    runs: int
    requeues: dict[str, int]
    gpu_hours: dict[str, float]              # per account
    goodput: dict[str, float | None]         # per account (None: no history known)
    emergency_saves_s: list[float] = field(default_factory=list)
    grace_s: int | None = None
    # whose jobs sacct showed: "all", or "own" where the cluster's PrivateData=jobs hides
    # other users' jobs from this (unprivileged) caller; the figures are then theirs alone
    scope: str = "all"

    @property
    def median_save_s(self) -> float | None:
        return statistics.median(self.emergency_saves_s) if self.emergency_saves_s else None

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "since": self.since, "jobs": self.jobs,
                "runs": self.runs, "requeues": self.requeues, "gpu_hours": self.gpu_hours,
                "goodput": self.goodput, "emergency_saves_s": self.emergency_saves_s,
                "median_emergency_save_s": self.median_save_s, "grace_s": self.grace_s,
                "scope": self.scope}


def aggregate(partition: str, since: str, rows: Sequence[RunRow],
              ledgers: Mapping[str, Sequence[tuple[str, Mapping[str, str]]]],
              reports: Mapping[str, Report],
              histories: Mapping[str, Sequence[Mapping[str, Any]]],
              grace_s: int | None, scope: str = "all") -> PartitionReport:
    """The partition's report from its runs, and the ledgers/reports/histories of the jobs
    whose state directories could be read (by job key)."""
    requeues: dict[str, int] = {}
    for job in dict.fromkeys(r.job for r in rows):
        if job in ledgers:
            for kind, fields in ledgers[job]:
                if kind == "requeue" and fields.get("cause"):
                    requeues[fields["cause"]] = requeues.get(fields["cause"], 0) + 1
            continue
        # every run but the last ended in a requeue (a RESIZING row: Slurm took a lost
        # node from a running job, and the run went on)
        runs = [r for r in rows if r.job == job and r.state != "RESIZING"]
        for run in runs[:-1]:
            cause = RUN_CAUSE.get(run.state, "requeued")
            requeues[cause] = requeues.get(cause, 0) + 1
    gpu_s: dict[str, float] = {}
    kept: dict[str, float] = {}
    known: dict[str, float] = {}
    for row in rows:
        gpu_s[row.account] = gpu_s.get(row.account, 0.0) + row.elapsed_s * row.gpus
    for job, rep in reports.items():
        account = next((r.account for r in rows if r.job == job), "")
        if rep.goodput is not None:
            kept[account] = kept.get(account, 0.0) + rep.gpu_s["kept"]
            known[account] = known.get(account, 0.0) + rep.allocated_gpu_s
    saves = [s for h in histories.values() for s in emergency_saves(h)]
    return PartitionReport(
        partition, since, jobs=len({r.job for r in rows}), runs=len(rows), requeues=requeues,
        gpu_hours={a: s / 3600 for a, s in sorted(gpu_s.items())},
        goodput={a: (kept[a] / known[a] if known.get(a) else None) for a in sorted(gpu_s)},
        emergency_saves_s=saves, grace_s=grace_s, scope=scope)


def emergency_saves(history: Sequence[Mapping[str, Any]], within_s: float = 5.0) -> list[float]:
    """How long each emergency save took, from rank 0's history: a ``saving`` phase after
    which the rank went on to ``exiting`` (``exit_for_requeue``) within ``within_s``."""
    phases = sorted((e for e in history if e.get("event") == "phase"), key=lambda e: e["t"])
    out = []
    for i, event in enumerate(phases):
        if event.get("phase") != "saving":
            continue
        rest = phases[i + 1:]
        done = next((e for e in rest if e.get("phase") != "saving"), None)
        exiting = next((e for e in rest if e.get("phase") == "exiting"), None)
        if done is not None and exiting is not None and exiting["t"] - done["t"] <= within_s:
            out.append(round(done["t"] - event["t"], 3))
    return out


def scope_of(private_data: str, uid: int, admin_level: str | None) -> str:
    """Whose jobs ``sacct -a`` lists: "own" when PrivateData includes ``jobs`` and the caller
    is neither root nor a Slurm operator/administrator (``admin_level``: sacctmgr's
    AdminLevel, None when unknown), else "all". Pure."""
    hidden = "jobs" in {w.strip().lower() for w in private_data.split(",")}
    privileged = uid == 0 or (admin_level or "").strip().lower() in ("operator",
                                                                     "administrator")
    return "own" if hidden and not privileged else "all"
