"""``hpctrain report --partition P [--since 7d]``: gather a partition's runs (one sacct
call), the partition's GraceTime, and the ledgers and histories of the jobs whose state
directories this user can read (their own hpctrain jobs); :mod:`hpctrain.report.partition`
aggregates."""

from __future__ import annotations

import json
import os
import pwd
import re
from pathlib import Path

import click

from hpctrain import protocol
from hpctrain.commands.report import gpus_of, ledger_entries, sacct_runs
from hpctrain.errors import ReportError, SlurmError
from hpctrain.jobs import index
from hpctrain.report.build import build
from hpctrain.report.partition import PartitionReport, RunRow, aggregate, scope_of
from hpctrain.slurm import client
from hpctrain.slurm.parse import (parse_elapsed, parse_kv_records, parse_sacct_parsable2,
                                  parse_scontrol_config)


def since_arg(since: str) -> str:
    """``7d`` -> ``now-7days``, ``12h`` -> ``now-12hours``; a date passes as it is."""
    m = re.fullmatch(r"(\d+)([dhm])", since.strip())
    if m:
        unit = {"d": "days", "h": "hours", "m": "minutes"}[m.group(2)]
        return f"now-{m.group(1)}{unit}"
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?)?", since.strip()):
        return since.strip()
    raise ReportError(f"--since {since!r}: give 7d, 12h, 30m or a date like 2026-11-01")


def partition_report(partition: str, since: str, as_json: bool) -> int:
    start = since_arg(since)
    try:
        res = client.run(["sacct", "-X", "-D", "-P", "-a", "-r", partition, "-S", start,
                          "-E", "now", "-o", "JobID,Account,State,ElapsedRaw,AllocTRES"])
    except SlurmError as exc:
        raise ReportError(f"sacct could not list partition {partition}: {exc}") from None
    rows = [RunRow(r["JobID"], r["Account"] or "-", (r["State"] or "").split(" ")[0],
                   float(r["ElapsedRaw"] or 0), gpus_of(r["AllocTRES"]))
            for r in parse_sacct_parsable2(res.stdout) if r["JobID"]]
    ledgers, reports, histories = {}, {}, {}
    readable = {job: state for job in dict.fromkeys(r.job for r in rows)
                if (state := _readable_state_dir(job)) is not None}
    runs = sacct_runs(*readable) if readable else {}
    for job, state in readable.items():
        ledgers[job], histories[job] = ledger_entries(state), protocol.read_history(state)
        reports[job] = build(job, runs.get(job, []), ledgers[job], histories[job])
    result = aggregate(partition, since, rows, ledgers, reports, histories, _grace(partition),
                       _scope())
    click.echo(json.dumps(result.to_json()) if as_json else format_partition(result))
    return 0


def _readable_state_dir(job: str) -> Path | None:
    """The state directory of one of this user's hpctrain jobs (None for anyone else's)."""
    rec = index.find(job)
    if rec is None:
        return None
    return protocol.find_state_dir(job, rec.checkpoint_dir, rec.extra.get("submit_dir", ""))


def _grace(partition: str) -> int | None:
    try:
        res = client.run(["scontrol", "show", "partition", "-o", partition])
    except SlurmError:
        return None
    found = parse_kv_records(res.stdout)
    return parse_elapsed(found[0].get("GraceTime", "")) if found else None


def _scope() -> str:
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


def format_partition(r: PartitionReport) -> str:
    lines = [f"partition {r.partition}, since {r.since}: {r.jobs} job(s), {r.runs} run(s)",
             "requeues by cause: " + (" ".join(f"{c}:{n}" for c, n in sorted(r.requeues.items()))
                                      or "none")]
    for account, hours in r.gpu_hours.items():
        good = r.goodput.get(account)
        lines.append(f"  account {account}: {hours:.2f} GPU-hours, goodput "
                     f"{'unknown' if good is None else f'{good:.1%}'}")
    if r.median_save_s is not None:
        grace = "unknown" if r.grace_s is None else f"{r.grace_s} s"
        lines.append(f"emergency saves: median {r.median_save_s:.1f} s over "
                     f"{len(r.emergency_saves_s)} (GraceTime {grace})")
    else:
        lines.append("emergency saves: none recorded (no readable progress history)")
    if r.scope == "own":
        lines.append("only your own jobs are counted: the cluster's PrivateData=jobs hides "
                     "other users' from you (run this as root or a Slurm operator for the "
                     "whole partition)")
    return "\n".join(lines)
