"""``hpctrain cancel JOB_ID ...``: scancel jobs (a sweep id cancels all its arrays)."""

from __future__ import annotations

import click

from hpctrain.commands.options import job_ids as check_ids
from hpctrain.errors import JobError
from hpctrain.jobs import index
from hpctrain.jobs.handle import cancel as cancel_jobs


@click.command()
@click.argument("job_ids", nargs=-1, required=True, metavar="JOB_ID...", callback=check_ids)
def cancel(job_ids: tuple[str, ...]) -> int:
    """Cancel jobs, array tasks (123_4) or whole sweeps, in one scancel call."""
    ids: list[str] = []
    for jid in job_ids:
        rec = index.find(jid)
        if rec is not None and rec.kind == "sweep" and rec.sweep_id == jid:
            ids += [m.job_id for m in index.sweep_members(jid)]
        else:
            ids.append(jid)
    done = cancel_jobs(ids)
    if done.cancelled:
        click.echo(f"cancelled {' '.join(done.cancelled)}")
    if done.ended:
        click.echo(f"already ended: {' '.join(done.ended)}" +
                   (f" ({done.note})" if done.note else ""))
    if done.unknown:
        raise JobError(f"no such job: {' '.join(done.unknown)}: Slurm has neither queued it "
                       "nor recorded it in its accounting (a typo? `hpctrain status` lists "
                       "your jobs); nothing was cancelled for it")
    return 0
