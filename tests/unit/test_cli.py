"""The CLI skeleton: version, help listing the groups, and the one error exit."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

import hpctrain
from hpctrain import cli
from hpctrain.errors import HpctrainError, SpecError


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert hpctrain.__version__ in capsys.readouterr().out


def test_help_lists_every_command_group_without_importing_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert name in out


def test_every_registered_command_imports_and_is_a_click_command() -> None:
    group = cli.cli
    ctx = click.Context(group)
    for name in cli.COMMANDS:
        assert isinstance(group.get_command(ctx, name), click.Command), name


def test_hpctrain_error_becomes_one_message_and_its_exit_code(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    @click.command()
    def boom() -> None:
        raise SpecError("nodes=0 must be >= 1: set nodes to 1 or more")

    monkeypatch.setitem(cli.COMMANDS, "boom", ("tests.fake:boom", "x"))
    monkeypatch.setattr(cli.LazyGroup, "get_command",
                        lambda self, ctx, name: boom if name == "boom" else None)
    assert cli.main(["boom"]) == SpecError.exit_code
    err = capsys.readouterr().err
    assert err.strip() == "hpctrain: error: nodes=0 must be >= 1: set nodes to 1 or more"
    assert issubclass(SpecError, HpctrainError)


def test_usage_error_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["no-such-command"]) == 2
    assert "No such command" in capsys.readouterr().err


def test_console_script_runs_without_importing_torch() -> None:
    code = ("import sys; from hpctrain.cli import main; rc = main(['--help']); "
            "bad = [m for m in ('torch', 'submitit', 'deepspeed') if m in sys.modules]; "
            "sys.exit(10 if bad else rc)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
