"""``hpctrain report --partition P [--since 7d]``: gather a partition's runs (one sacct
call), the partition's GraceTime, and the ledgers and histories of the jobs whose state
directories this user can read (their own hpctrain jobs); :mod:`hpctrain.report.partition`
aggregates."""

from __future__ import annotations

import json
import re

import click

from hpctrain import protocol
from hpctrain.errors import ReportError
from hpctrain.jobs import accounting, statedir
from hpctrain.report.build import build
from hpctrain.report.partition import PartitionReport, aggregate


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
    rows = accounting.partition_runs(partition, since_arg(since))
    ledgers, reports, histories = {}, {}, {}
    # the state directories of this user's own hpctrain jobs (None for anyone else's)
    readable = {job: state for job in dict.fromkeys(r.job for r in rows)
                if (state := statedir.lookup(job)) is not None}
    runs = accounting.job_runs(*readable) if readable else {}
    for job, state in readable.items():
        ledgers[job], histories[job] = statedir.ledger_lines(state), protocol.read_history(state)
        reports[job] = build(job, runs.get(job, []), ledgers[job], histories[job])
    result = aggregate(partition, since, rows, ledgers, reports, histories,
                       accounting.grace_s(partition), accounting.visible_scope())
    click.echo(json.dumps(result.to_json()) if as_json else format_partition(result))
    return 0


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
