"""--host without a network: parsing targets, quoting remote words, reading ssh's failures,
the version handshake, and the request the cluster side accepts (pure parts)."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from click.testing import CliRunner

from hpctrain import __version__
from hpctrain.cli import check_client_version, cli, main
from hpctrain.errors import RemoteError
from hpctrain.remote.ssh import Target, classify, quote_word, remote_line


@pytest.mark.parametrize("text,want", [
    ("login1", Target("login1")),
    ("alice@login1", Target("login1", "alice")),
    ("alice@cluster.example.org:2222", Target("cluster.example.org", "alice", 2222)),
    ("hpctrain-devcluster", Target("hpctrain-devcluster")),
    ("[::1]:2222", Target("::1", "", 2222)),
])
def test_target_parse(text: str, want: Target) -> None:
    assert Target.parse(text) == want
    assert Target.parse(str(want)) == want


@pytest.mark.parametrize("bad", ["", "-oProxyCommand=sh", "a b", "host:0", "host:99999",
                                 "host:x", "al ice@host", "host;rm", "@host", "$(id)"])
def test_target_parse_refuses(bad: str) -> None:
    with pytest.raises(RemoteError, match="is not \\[user@\\]host"):
        Target.parse(bad)


def test_remote_line_is_one_word_per_argument_for_the_remote_shell() -> None:
    hostile = ["echo", "a b", "$(touch /tmp/pwned)", "`id`", "x;y", "'q'", "~/venv/bin/x",
               "~root", "new\nline"]
    line = remote_line(hostile)
    # what the remote sh would see: the same words, nothing run, only ~/ expanded
    assert shlex.split(line) == [w if not w.startswith("~/") else w for w in hostile]
    out = subprocess.run(["sh", "-c", f"printf '%s\\n' {remote_line(hostile[1:])}"],
                         capture_output=True, text=True, env={"HOME": "/home/h"}).stdout
    assert out.split("\n")[:5] == ["a b", "$(touch /tmp/pwned)", "`id`", "x;y", "'q'"]
    assert "/home/h/venv/bin/x" in out and "~root" in out
    assert quote_word("~/a b") == "~/'a b'"


TARGET = Target("login1", "alice")


@pytest.mark.parametrize("code,stderr,match", [
    (255, "Host key verification failed.", "host key verification failed.*ssh-keygen -R login1"),
    (255, "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@", "host key"),
    (255, "alice@login1: Permission denied (publickey).", "authentication failed.*ssh-add"),
    (255, "ssh: Could not resolve hostname login1: Name or service not known",
     "cannot resolve login1"),
    (255, "ssh: connect to host login1 port 22: Connection refused", "cannot connect to"),
    (255, "kex_exchange_identification: weird", "ssh to alice@login1 failed"),
    (127, "sh: 1: hpctrain: not found", "hpctrain is not installed on alice@login1"),
    (2, "Error: No such option: --client-version", "older than this client.*version skew"),
])
def test_classify_names_host_and_fix(code: int, stderr: str, match: str) -> None:
    error = classify(TARGET, code, stderr, ["hpctrain"])
    assert error is not None and error.exit_code == 7
    assert __import__("re").search(match, str(error)), str(error)


def test_classify_leaves_the_remote_commands_own_failures_alone() -> None:
    assert classify(TARGET, 2, "hpctrain: error: spec.toml: name is missing", ["hpctrain"]) is None
    assert classify(TARGET, 0, "", ["hpctrain"]) is None


def test_client_version_handshake() -> None:
    check_client_version(__version__)
    major, minor, *_ = __version__.split(".")
    check_client_version(f"{major}.{minor}.99")          # a patch release speaks the same
    with pytest.raises(RemoteError, match=f"version skew: this client is hpctrain 0.1.0, "
                                          f"the cluster has {__version__}"):
        check_client_version("0.1.0")
    # through the CLI: the cluster's hpctrain refuses, exit 7, before running anything
    assert main(["--client-version", "0.1.0", "status", "--json"]) == 7


def test_host_refuses_local_tools_and_bad_hosts() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["--host", "login1", "render", "x.toml"], standalone_mode=False)
    assert isinstance(res.exception, RemoteError)
    assert "runs on this machine, not with --host" in str(res.exception)
    assert main(["--host", "bad host", "status"]) == 7


def test_host_from_environment_leaves_local_tools_local(monkeypatch) -> None:
    monkeypatch.setenv("HPCTRAIN_HOST", "login1")
    res = CliRunner().invoke(cli, ["render", "--help"])
    assert res.exit_code == 0 and "print the sbatch script" in res.output
