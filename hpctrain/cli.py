"""The ``hpctrain`` command: one click group, lazily loaded subcommands, one error exit.

Subcommands live in ``hpctrain.commands.<name>`` (listed in ``hpctrain.commands.registry``)
and are imported only when invoked, so ``hpctrain --help`` and every login-node command
stay fast (no torch import).
:func:`main` is the only place an :class:`~hpctrain.errors.HpctrainError` becomes a
message on stderr and an exit code.
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

import click

from hpctrain import __version__
from hpctrain.commands.registry import (COMMANDS, HIDDEN, HOST_ENV, REMOTE_COMMAND_ENV,
                                        REMOTE_COMMANDS)
from hpctrain.errors import HpctrainError


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use, not at startup."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        host = ctx.params.get("host")
        explicit = ctx.get_parameter_source("host") is click.core.ParameterSource.COMMANDLINE
        if host and (name in REMOTE_COMMANDS or (explicit and name in self._lazy)):
            # the same command, run on the cluster (the code and spec go along for submit);
            # a local tool (render, plan, ckpt...) with $HPCTRAIN_HOST set still runs here
            from hpctrain.commands.remote import remote_command
            return remote_command(name, host, ctx.params.get("remote_command"))
        if name in HIDDEN:
            module_name, attr = HIDDEN[name].split(":")
            return getattr(importlib.import_module(module_name), attr)
        if name in self._lazy:
            target, _ = self._lazy[name]
            module_name, attr = target.split(":")
            return getattr(importlib.import_module(module_name), attr)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from the table so listing commands imports none of them.
        rows = [(name, self._lazy[name][1]) for name in sorted(self._lazy)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _exit_codes() -> str:
    from hpctrain.errors import EXIT_CODES

    # \b: click keeps the lines of this paragraph as they are
    rows = (f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES)
    return "\b\nExit codes:\n" + "\n".join(rows)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=_exit_codes())
@click.version_option(__version__, prog_name="hpctrain")
@click.option("--host", envvar=HOST_ENV, metavar="[USER@]HOST[:PORT]",
              help="Run submit, sweep, status, logs, cancel and report on this cluster over "
                   f"SSH (your ~/.ssh/config, keys and agent) [env: {HOST_ENV}].")
@click.option("--remote-command", envvar=REMOTE_COMMAND_ENV, metavar="COMMAND",
              help="How to start hpctrain on the --host cluster, e.g. ~/venv/bin/hpctrain "
                   f"[default: hpctrain; env: {REMOTE_COMMAND_ENV}].")
@click.option("--client-version", hidden=True,
              help="Set by a --host client: refuse to serve a client of another version.")
def cli(host: str | None, remote_command: str | None, client_version: str | None) -> None:
    """hpctrain: training jobs on SLURM GPU clusters, rendered, submitted and kept alive."""
    if client_version:
        check_client_version(client_version)


def check_client_version(client: str) -> None:
    """A --host client speaks the request format of its minor version: refuse another
    release line with both versions named (a patch release differs in nothing sent)."""
    from hpctrain.errors import RemoteError

    if client.split(".")[:2] != __version__.split(".")[:2]:
        raise RemoteError(f"version skew: this client is hpctrain {client}, the cluster has "
                          f"{__version__}: install the same release on both (pip install "
                          f"hpctrain=={__version__} on your machine, or upgrade the "
                          "cluster's)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code; the one place errors become messages."""
    try:
        rv = cli.main(args=list(argv) if argv is not None else None, prog_name="hpctrain",
                      standalone_mode=False)
    except HpctrainError as exc:
        click.echo(f"hpctrain: error: {exc}", err=True)
        return exc.exit_code
    except click.UsageError as exc:
        # one line, as every other error: a wrong option or argument, and where to look
        where = exc.ctx.command_path if exc.ctx is not None else "hpctrain"
        click.echo(f"hpctrain: error: {exc.format_message()} (see `{where} --help`)", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("hpctrain: aborted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("hpctrain: interrupted", err=True)
        return 130
    return rv if isinstance(rv, int) else 0

