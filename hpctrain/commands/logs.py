"""``hpctrain logs JOB_ID [--follow] [--rank N]``: a job's output, or a live stream of it."""

from __future__ import annotations

import click

from hpctrain.commands.options import job_ids as check_ids
from hpctrain.commands.reader import reader_gone, wait_while_read
from hpctrain.jobs.handle import Job


@click.command()
@click.argument("job_id", callback=check_ids)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the job ends.")
@click.option("--rank", type=int, default=None, help="Only this rank's output.")
def logs(job_id: str, follow: bool, rank: int | None) -> int:
    """Print the output of JOB_ID (a job submitted through hpctrain; 123_4 for a sweep task)."""
    job = Job.attach(job_id)
    if rank is not None and not job.entry.rank_log:
        click.echo(f"note: the ranks of job {job_id} share one log; only lines labelled "
                   f"'{rank}: ' (srun --label) can be told apart", err=True)
    if not follow:
        text = job.logs(rank)
        if not text:
            click.echo(f"no output yet at {job.log_path(rank)} (job {job_id}: {job.state})",
                       err=True)
        click.echo(text, nl=False)
        return 0
    click.echo(f"following {job.log_path(rank)} (Ctrl-C stops following, not the job)", err=True)
    try:
        for line in job.follow(rank, idle=wait_while_read):
            click.echo(line)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # `| head`; over ssh, the client's Ctrl-C
        return reader_gone()
    click.echo(f"job {job_id} ended {job.state}", err=True)
    return 0
