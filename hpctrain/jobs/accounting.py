"""What Slurm's accounting says about runs, for ``hpctrain report``: every run of some jobs,
a partition's runs over a period, its GraceTime, and whose jobs this user may see.

One ``sacct`` call per question (``-D``: one line per run, requeued runs included); the
answers are the pure builders' inputs (:mod:`hpctrain.report.build`,
:mod:`hpctrain.report.partition`). Failures the report cannot do without are
:class:`~hpctrain.errors.ReportError`. (Job states for ``status`` are
:mod:`hpctrain.jobs.poll`'s.)
"""

from __future__ import annotations

import os
import pwd

from hpctrain.errors import ReportError, SlurmError
from hpctrain.report.build import RunFacts
from hpctrain.report.partition import RunRow, scope_of
from hpctrain.slurm import client
from hpctrain.slurm.parse import (parse_elapsed, parse_kv_records, parse_sacct_parsable2,
                                  parse_scontrol_config, resized)
from hpctrain.slurm.view import slurm_time

RUN_FIELDS = "JobID,State,Submit,Start,End,ElapsedRaw,NodeList,AllocTRES,Partition"
PARTITION_FIELDS = "JobID,Account,State,ElapsedRaw,AllocTRES"


def job_runs(*ids: str) -> dict[str, list[RunFacts]]:
    """Every run of each job (an array id brings all its tasks), oldest first, by job key
    (123, 120_4): ONE sacct call (-D: one line per run)."""
    try:
        res = client.run(["sacct", "-X", "-D", "-P", "-j", ",".join(ids), "-o", RUN_FIELDS])
    except SlurmError as exc:
        raise ReportError(f"sacct could not report job(s) {','.join(ids)}: {exc}") from None
    return runs_from_rows(parse_sacct_parsable2(res.stdout))


def runs_from_rows(rows: list[dict[str, str]]) -> dict[str, list[RunFacts]]:
    """sacct -X -D rows (oldest first) -> runs by job key. A resize is not a run: Slurm
    closes a RESIZING row each time a node is taken from a running job ([elastic] spare
    nodes) while the run goes on; it is folded into the row that follows (its start, its
    nodes, the GPU-seconds of every segment)."""
    by_job: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_job.setdefault(r["JobID"], []).append(r)
    runs: dict[str, list[RunFacts]] = {}
    for key, recs in by_job.items():
        mine = runs[key] = []
        segments: list[dict[str, str]] = []
        for r, following in zip(recs, [*recs[1:], None]):
            segments.append(r)
            if not resized(r, following):
                mine.append(_run(len(mine), segments))
                segments = []
    return runs


def _run(restart: int, segments: list[dict[str, str]]) -> RunFacts:
    """One run from its sacct rows: the resizes it went through, then its end."""
    first, last = segments[0], segments[-1]
    state = last["State"].split()[0] if last["State"] else ""
    if state == "RESIZING":   # the job's requeue closed it: sacct wrote no REQUEUED row
        state = "REQUEUED"
    elapsed = [float(x["ElapsedRaw"] or 0) for x in segments]
    return RunFacts(restart=restart, state=state, submit=slurm_time(first["Submit"]),
                    start=slurm_time(first["Start"]), end=slurm_time(last["End"]),
                    elapsed_s=sum(elapsed), nodes=first["NodeList"],
                    gpus=gpus_of(first["AllocTRES"]),
                    gpu_s=sum(e * gpus_of(x["AllocTRES"]) for e, x in zip(elapsed, segments)),
                    partition=last.get("Partition", ""))


def partition_runs(partition: str, start: str) -> list[RunRow]:
    """Every run on ``partition`` since ``start`` (sacct's ``-S``), every user's that this
    user may see: ONE sacct call."""
    try:
        res = client.run(["sacct", "-X", "-D", "-P", "-a", "-r", partition, "-S", start,
                          "-E", "now", "-o", PARTITION_FIELDS])
    except SlurmError as exc:
        raise ReportError(f"sacct could not list partition {partition}: {exc}") from None
    return [RunRow(r["JobID"], r["Account"] or "-", (r["State"] or "").split(" ")[0],
                   float(r["ElapsedRaw"] or 0), gpus_of(r["AllocTRES"]))
            for r in parse_sacct_parsable2(res.stdout) if r["JobID"]]


def gpus_of(tres: str) -> int:
    """``cpu=4,gres/gpu=4,node=2`` -> 4 (1 when the job holds no GPU: count its time once)."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" and value.isdigit():
            return int(value)
    return 1


def grace_s(partition: str) -> int | None:
    """The partition's GraceTime in seconds; None when Slurm does not say."""
    try:
        res = client.run(["scontrol", "show", "partition", "-o", partition])
    except SlurmError:
        return None
    found = parse_kv_records(res.stdout)
    return parse_elapsed(found[0].get("GraceTime", "")) if found else None


def visible_scope() -> str:
    """Whose jobs this user's sacct sees (report.partition.scope_of): slurmdbd's PrivateData
    decides (``sacctmgr show config``, its "SlurmDBD configuration" part); "all" when Slurm
    does not say."""
    try:
        shown = client.run(["sacctmgr", "show", "config"]).stdout
    except SlurmError:
        return "all"
    _, found, dbd = shown.partition("SlurmDBD configuration:")
    private = parse_scontrol_config(dbd).get("PrivateData", "") if found else ""
    if scope_of(private, os.getuid(), None) == "all":   # nothing hidden, or root
        return "all"
    user = pwd.getpwuid(os.getuid()).pw_name
    try:
        level = client.run(["sacctmgr", "-n", "-P", "show", "user", user,
                            "format=AdminLevel"]).stdout.strip() or None
    except SlurmError:
        level = None
    return scope_of(private, os.getuid(), level)
