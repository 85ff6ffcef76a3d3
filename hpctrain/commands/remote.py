"""``hpctrain --host H COMMAND ...``: the same commands, run on a cluster over SSH.

``status``, ``logs``, ``cancel`` and ``report`` pass their arguments to the cluster's
hpctrain as they are (one round trip, to its warm server when there is one; ``logs
--follow`` streams over its own ssh session). ``submit``
and ``sweep`` read the spec here, send the code (a snapshot of the current directory,
unless ``[run] snapshot = false``) and the spec, and print what the cluster answered.
Exit codes are the cluster's; ssh's own failures are :class:`~hpctrain.errors.RemoteError`.
"""

from __future__ import annotations

import json
from typing import Any

import click

from hpctrain.commands.options import (grid_option, json_option, load_spec, sets_option,
                                       spec_argument)
from hpctrain.commands.registry import REMOTE_COMMANDS
from hpctrain.errors import RemoteError

FORWARDED = ("status", "logs", "cancel", "report")
# a directory on the cluster, so unchecked here (the cluster's hpctrain checks it)
templates_option = click.option(
    "--templates", "template_dirs", multiple=True, metavar="DIR",
    help="A template directory on the cluster (relative: to your home there), layered over "
         "its $HPCTRAIN_TEMPLATES and built-in templates (repeatable; first wins).")
NO_HELP: dict[str, Any] = {"ignore_unknown_options": True, "allow_extra_args": True,
                           "help_option_names": []}


def remote_command(name: str, host: str, remote: str | None) -> click.Command:
    """The click command that runs ``name`` on ``host``."""
    from hpctrain.remote.ssh import Connection

    if name not in REMOTE_COMMANDS:
        raise RemoteError(f"`hpctrain {name}` runs on this machine, not with --host: run it "
                          f"here without --host, or on the cluster (ssh {host} hpctrain "
                          f"{name} ...); --host takes {', '.join(REMOTE_COMMANDS)}")
    conn = Connection(host, remote_command=remote)
    if name in FORWARDED:
        @click.command(name=name, context_settings=NO_HELP)
        @click.argument("args", nargs=-1, type=click.UNPROCESSED)
        def forward(args: tuple[str, ...]) -> int:
            return conn.hpctrain_stream([name, *args])
        return forward
    return _submit_command(conn) if name == "submit" else _sweep_command(conn)


def _send(conn: Any, request: dict[str, Any]) -> int:
    return conn.stream(conn.hpctrain_words(["_serve", "submit"]),
                       input=json.dumps(request).encode())


def _request(conn: Any, spec: Any, **fields: Any) -> dict[str, Any]:
    from hpctrain.remote.client import passthrough, stage

    dry = bool(fields.get("dry_run"))
    staged = stage(conn, spec.run.snapshot, workdir=spec.workdir, send=not dry)
    if dry and staged["snapshot"]:
        click.echo(f"note: a dry run sends no code; the job would run from snapshot "
                   f"{staged['snapshot']['id']} of this directory (set [run] snapshot = "
                   "false to run the cluster's copy instead)", err=True)
    return {"spec": spec.to_dict(), "passthrough": passthrough(spec.run.env_passthrough),
            **staged, **fields}


def _submit_command(conn: Any) -> click.Command:
    @click.command(name="submit")
    @spec_argument
    @sets_option
    @templates_option
    @click.option("--folder", default=None,
                  help="Root of job folders on the cluster [default: its HPCTRAIN_JOBS_DIR "
                       "or ~/hpctrain-jobs].")
    @click.option("--dry-run", is_flag=True, help="Print the cluster's plan and script.")
    @click.option("--wait", is_flag=True, help="Show progress until the job ends.")
    @json_option
    def submit(spec_file: str, sets: tuple[str, ...], template_dirs: tuple[str, ...],
               folder: str | None, dry_run: bool, wait: bool, as_json: bool) -> int:
        """Send SPEC and this directory's code to the --host cluster and submit it there."""
        spec = load_spec(spec_file, sets)
        return _send(conn, _request(conn, spec, kind="submit", templates=list(template_dirs),
                                    folder=folder, dry_run=dry_run, wait=wait, json=as_json))
    return submit


def _sweep_command(conn: Any) -> click.Command:
    from hpctrain.jobs.sweep import parse_grid

    @click.command(name="sweep")
    @spec_argument
    @grid_option
    @click.option("--max-parallel", type=int, default=None,
                  help="At most this many grid points run at once.")
    @sets_option
    @templates_option
    @click.option("--folder", default=None, help="Root of job folders on the cluster.")
    @click.option("--dry-run", is_flag=True, help="List the points; submit nothing.")
    @json_option
    def sweep(spec_file: str, grids: tuple[str, ...], max_parallel: int | None,
              sets: tuple[str, ...], template_dirs: tuple[str, ...], folder: str | None,
              dry_run: bool, as_json: bool) -> int:
        """Send SPEC and this directory's code to the --host cluster and sweep there."""
        spec = load_spec(spec_file, sets)
        return _send(conn, _request(conn, spec, kind="sweep", grid=parse_grid(grids),
                                    max_parallel=max_parallel, templates=list(template_dirs),
                                    folder=folder, dry_run=dry_run, json=as_json))
    return sweep
