"""``hpctrain submit SPEC``: validate, render, submit; or ``--dry-run`` to see plan and script."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from hpctrain.commands.jobview import exit_code_for, format_elapsed, job_json, progress_line
from hpctrain.commands.options import (about_spec, folder_option, json_option, load_spec,
                                       sets_option, show_script, spec_argument,
                                       templates_option)
from hpctrain.commands.table import table
from hpctrain.jobs.view import info_json
from hpctrain.spec.model import JobSpec


@click.command()
@spec_argument
@sets_option
@templates_option
@folder_option
@click.option("--dry-run", is_flag=True, help="Print the plan and the script; submit nothing.")
@click.option("--wait", is_flag=True,
              help="Show progress until the job ends; exit non-zero unless it COMPLETED.")
@json_option
def submit(spec_file: str, sets: tuple[str, ...], template_dirs: list[Any],
           folder: str | None, dry_run: bool, wait: bool, as_json: bool) -> int:
    """Render SPEC with the partition's templates and submit it to Slurm."""
    spec = load_spec(spec_file, sets)
    with about_spec(spec_file):
        return run_submit(spec, spec_path=os.path.abspath(spec_file),
                          template_dirs=template_dirs, folder=folder, dry_run=dry_run,
                          wait=wait, as_json=as_json)


def run_submit(spec: JobSpec, *, spec_path: str, template_dirs: list[Any], folder: str | None,
               dry_run: bool, wait: bool, as_json: bool, origin: Any = None,
               snapshot_default: bool = False) -> int:
    """``submit``'s work and output, shared with the cluster side of ``--host``
    (hpctrain.commands.serve), which passes where the client's code was staged."""
    if dry_run:
        return _dry_run(spec, template_dirs, as_json, folder, origin, snapshot_default)
    from hpctrain.jobs.submit import submit as api_submit  # imports submitit: only when submitting

    job = api_submit(spec, folder=folder, templates=template_dirs, spec_path=spec_path,
                     origin=origin, snapshot_default=snapshot_default)
    log = str(job.log_path())
    snapshot = job.entry.extra.get("snapshot", "")
    if as_json and not wait:
        click.echo(json.dumps(job_json(job, state="SUBMITTED", log=log)))
        return 0
    if not as_json:
        click.echo(f"submitted job {job.job_id} ({spec.name}) on partition {spec.partition}")
        click.echo(f"  log:      {log}")
        if snapshot:
            click.echo(f"  snapshot: {snapshot} (the job runs {job.entry.extra['snapshot_dir']})")
        click.echo(f"  follow:   hpctrain logs {job.job_id} --follow")
        click.echo(f"  status:   hpctrain status {job.job_id}")
    if not wait:
        return 0
    return _wait(job, as_json)


def _wait(job: Any, as_json: bool) -> int:
    from hpctrain.jobs.contract import LIVE_S, wait_for

    last, latest = [""], [None]
    # one line updated in place on a terminal; a new line per change otherwise (a log)
    tty = (sys.stderr if as_json else sys.stdout).isatty()

    def show(info: Any) -> None:
        latest[0] = info
        line = progress_line(job, info)
        if line == last[0]:
            return
        if tty:
            click.echo("\r\033[K" + line, nl=False, err=as_json)
        else:
            click.echo(line, err=as_json)
        last[0] = line

    def idle(pause: float) -> None:
        """Between Slurm's polls (up to 10 s apart while nothing changes there), the
        running job's step again every LIVE_S: its supervisor is asked, not Slurm."""
        end = time.monotonic() + pause
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(LIVE_S, left))
            if left > LIVE_S and latest[0] is not None and str(latest[0].state) == "RUNNING":
                show(latest[0])

    try:
        info = wait_for(job.job_id, job.updates(idle=idle), on_update=show,
                        cancel_hint=job.cancel_hint)
        if tty:
            click.echo("", err=as_json)
    except KeyboardInterrupt:
        click.echo(f"stopped waiting; job {job.job_id} keeps running "
                   f"(hpctrain cancel {job.job_id} to stop it)", err=True)
        return 130
    if as_json:
        click.echo(json.dumps({**job_json(job, state=str(info.state), log=str(job.log_path())),
                               **info_json(info)}))
    else:
        from hpctrain.jobs.view import wait_progress

        # the step it ended at, from the supervisor's final summary (it has left)
        live, _ = wait_progress(job.job_id, job.entry, running=False)
        click.echo(f"job {job.job_id} ended {info.state} after {format_elapsed(info.elapsed_s)}"
                   + (f"  {live}" if live else ""))
    return exit_code_for(info)


def _dry_run(spec: JobSpec, templates: list[Any], as_json: bool, folder: str | None = None,
             origin: Any = None, snapshot_default: bool = False) -> int:
    from hpctrain.jobs.paths import job_folder
    from hpctrain.jobs.precheck import precheck
    from hpctrain.jobs.facts import render_here
    from hpctrain.jobs.submit import freeze

    precheck(spec)     # what would fail the job at its start, said before the queue
    # the script as it would run: from its snapshot when there is one (named, not copied)
    frozen = freeze(spec, job_folder(spec.name, folder), origin, default=snapshot_default,
                    write=False)
    rendered = render_here(frozen.spec, templates, python=sys.executable,
                           snapshot=frozen.snapshot)
    if as_json:
        click.echo(json.dumps({"dry_run": True, "plan": plan_json(rendered.plan),
                               "requests": rendered.requests.to_json(),
                               "partition_facts": rendered.partition.source,
                               "template": rendered.template_path, "script": rendered.script,
                               "snapshot": frozen.snapshot[0] if frozen.snapshot else None}))
        return 0
    click.echo(plan_table(rendered.plan, model=frozen.spec.model,
                          memory=rendered.requests.memory))
    click.echo(rendered.requests.describe())
    click.echo(f"partition facts: {rendered.partition.source}")
    click.echo(f"template: {rendered.template_path}")
    if frozen.snapshot:
        click.echo(f"snapshot: {frozen.snapshot[0]} (would be copied to {frozen.snapshot[1]})")
    click.echo("--- script " + "-" * 60)
    show_script(rendered.script)
    click.echo("--- dry run: nothing was submitted", err=True)
    return 0


def plan_json(plan: Any) -> dict[str, Any]:
    return {"partition": plan.partition, "nodes": plan.nodes,
            "gpus_per_node": plan.gpus_per_node, "launcher": plan.launcher,
            "tasks_per_node": plan.tasks_per_node, "procs_per_task": plan.procs_per_task,
            "world": plan.world, "tp": plan.tp, "dp": plan.dp, "pp": plan.pp,
            "time_s": plan.time_s, "spare_nodes": plan.spare_nodes,
            "job_nodes": plan.job_nodes, "peer_copies": plan.peer_copies,
            "min_nodes": plan.min_nodes}


SNAPSHOT_BYTES_PER_PARAM = 12   # a training state_dict: fp32 weights and Adam's two moments
COPIES_PER_RANK = 4             # in node memory: a rank's two newest, two of its ward's


def peer_copies_cost(plan: Any, model: Any = None, memory: tuple[str, str] | None = None
                     ) -> str:
    """What peer copies cost in node memory, with a figure when the spec names the model's
    size (``[model] params``), and whether that fits the job's memory request."""
    text = ("peer copies: each rank's snapshots are also kept in its node's memory "
            "(/dev/shm) and a partner's on another node, so a lost node costs at most two "
            f"snapshot intervals; node memory holds up to {COPIES_PER_RANK} copies of each "
            "rank's snapshot (its two newest, two of the rank it keeps copies for)")
    if model is not None and model.mode == "train":
        rank = model.params * SNAPSHOT_BYTES_PER_PARAM / (plan.tp * plan.pp)
        node = COPIES_PER_RANK * rank * plan.world / plan.nodes
        text += (f": about {node / 2**30:.1f} GiB a node for {model.params:.3g} parameters "
                 f"({rank / 2**30:.2f} GiB a rank's snapshot: fp32 weights and Adam's moments, "
                 f"tp x pp = {plan.tp * plan.pp} shards, not ZeRO-sharded)")
        if memory is not None and memory[0] == "mem" and memory[1] != "0" and \
                node > int(memory[1].rstrip("M")) * 2**20 / 2:
            text += (f", more than half the job's memory request ({memory[1]} a node), "
                     "which node memory counts against where Slurm limits a job's memory: "
                     "ask for more (resources.mem_per_node_gb) or snapshot less")
    return text + " ([elastic] peer_copies = false to turn it off)"


def spare_cost(plan: Any) -> str:
    """What [elastic] spare nodes cost: their GPUs are allocated, idle, the whole job."""
    gpus = plan.spare_nodes * plan.gpus_per_node
    upto = f", up to {gpus * plan.time_s / 3600:.1f} GPU-h per run" if plan.time_s else ""
    return (f"spare nodes: {plan.spare_nodes} held for a lost one ({gpus} GPU(s) idle until "
            f"then: {plan.spare_nodes / plan.job_nodes:.0%} of the job's GPU-hours{upto}); "
            f"the job asks Slurm for {plan.job_nodes} node(s)")


def shrink_plan(plan: Any) -> str:
    """What [elastic] min_nodes does: the widths a lost node may leave the step at."""
    from hpctrain.mesh import shrink_widths

    widths = shrink_widths(plan.nodes, plan.min_nodes, plan.gpus_per_node, plan.tp, plan.pp)
    group = plan.tp * plan.pp
    ways = ", ".join(f"{n} node(s) at dp {n * plan.gpus_per_node // group} (each rank "
                     f"{plan.dp * group // (n * plan.gpus_per_node)} micro-batch(es) a step)"
                     for n in widths)
    return (f"shrink: a lost node with no spare left, the job goes on in the same run on "
            f"{ways}; below {plan.min_nodes} node(s) it is requeued; the next start asks "
            f"for {plan.nodes} again")


def plan_table(plan: Any, max_rows: int = 16, model: Any = None,
               memory: tuple[str, str] | None = None) -> str:
    """The plan: allocation, launcher and the rank -> (node, pp, dp, tp) table."""
    lines = [
        f"partition {plan.partition}: {plan.nodes} node(s) x {plan.gpus_per_node} GPU(s), "
        f"launcher {plan.launcher}: {plan.tasks_per_node} task(s)/node x "
        f"{plan.procs_per_task} process(es)/task",
        f"layout: world={plan.world} = tp {plan.tp} x dp {plan.dp} x pp {plan.pp} "
        "(rank order: tp fastest, then dp, then pp)",
    ]
    if plan.min_nodes is not None and plan.min_nodes < plan.nodes:
        lines.insert(1, shrink_plan(plan))
    if plan.spare_nodes:
        lines.insert(1, spare_cost(plan))
    if plan.peer_copies:
        lines.insert(1, peer_copies_cost(plan, model, memory))
    rows = [[rank, plan.node_of(rank), *plan.coords(rank)] for rank in
            range(min(plan.world, max_rows))]
    lines.append(table(["rank", "node", "pp", "dp", "tp"], rows, right=range(5), gap=" "))
    if plan.world > max_rows:
        lines.append(f"  ... {plan.world - max_rows} more ranks")
    return "\n".join(lines)

