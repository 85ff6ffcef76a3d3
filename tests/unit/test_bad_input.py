"""Bad input gets an honest answer (issue 43): one line naming the value and the fix, and
the exit code docs/cli.md's table gives it; input that is odd but good gets the right
result. Table-driven: (argv, exit code, what the message says). Every case goes through
the CLI's one error exit (hpctrain.cli.main), as a user's would."""

from __future__ import annotations

import codecs
import re
from pathlib import Path

import pytest

from hpctrain import cli, errors
from helpers.jobs import isolate
from helpers.specs import BASE, spec_toml

SPEC = spec_toml(**BASE)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def files(root: Path) -> dict[str, Path]:
    """Spec files as users have handed them in."""
    made = {"utf16": SPEC.encode("utf-16"), "bom": codecs.BOM_UTF8 + SPEC.encode(),
            "binary": b"name = \"x\"\n\0\x01\x02",
            "latin1": "name = \"caf\xe9\"\n".encode("latin-1"),
            "deep": ("x = " + "[" * 100_000 + "]" * 100_000 + "\n").encode(),
            "good": SPEC.encode(),
            "layout": spec_toml(**{**BASE, "gpus_per_node": 2, "layout": {"tp": 2}})
            .replace("tp = 2", "tp = 3").encode(),
            "partition": SPEC.replace('partition = "debug"', 'partition = "nope"').encode()}
    out = {}
    for name, data in made.items():
        out[name] = root / f"{name}.toml"
        out[name].write_bytes(data)
    return out


CASES = [
    # (argv with {file} placeholders, exit code, message fragment)
    (["cancel", "\u0661\u0662\u0663"], 2, "'\u0661\u0662\u0663' is not a job id"),   # Arabic-Indic
    (["cancel", "123\n"], 2, r"'123\n' is not a job id"),
    (["status", "$(id)"], 2, "'$(id)' is not a job id"),
    (["status", "1;id"], 2, "'1;id' is not a job id"),
    (["logs", "12 13"], 2, "'12 13' is not a job id"),
    (["report", "-1"], 2, "No such option"),
    (["report", "1_x"], 2, "'1_x' is not a job id"),
    (["render", "{utf16}"], 2, "utf16.toml: the file is UTF-16: save it as UTF-8"),
    (["render", "{binary}"], 2, "binary.toml: a binary file (a NUL byte at offset 11)"),
    (["render", "{latin1}"], 2, "latin1.toml: not UTF-8 text (byte 0xe9 at offset 11)"),
    (["render", "{deep}"], 2, "deep.toml: not valid TOML: arrays or tables nested too deeply"),
    (["render", "/dev/zero"], 2, "/dev/zero: larger than 1 MiB: not a spec file"),
    (["render", "{bom}"], 0, "#SBATCH --job-name=gpt-tiny"),          # a BOM is fine
    # errors found past reading name the file too
    (["render", "{layout}"], 2, "layout.toml: tp=3 does not divide gpus_per_node=2"),
    (["submit", "{layout}", "--dry-run"], 2, "layout.toml: tp=3 does not divide"),
    (["sweep", "{partition}", "--dry-run", "--grid", "run.env.A=1,2"], 2,
     "partition.toml: unknown partition 'nope'"),
    (["render", "{good}", "--set", "run.env.VER=1.10", "--set", "run.env.LR=3e-4",
      "--set", "run.env.MASK=0x10", "--set", "run.env.ON=true"], 0, "VER=1.10"),
    (["plan", "--params", "1e30", "--gpus-per-node", "8", "--gpu-mem", "80GB"], 2,
     "--params='1e30' is out of range: use 1M to 100T"),
    (["plan", "--params", "0.5", "--gpus-per-node", "8", "--gpu-mem", "80GB"], 2,
     "--params='0.5' is out of range"),
]


@pytest.mark.parametrize("argv,code,said", CASES, ids=[" ".join(c[0])[:40] for c in CASES])
def test_bad_input_gets_a_clear_answer_and_its_exit_code(
        argv: list[str], code: int, said: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    paths = files(tmp_path)
    got = cli.main([a.format(**paths) if a.startswith("{") else a for a in argv])
    out, err = capsys.readouterr()
    assert got == code, (out, err)
    assert said in (out if code == 0 else err), (out, err)
    if code:
        assert len(err.strip().splitlines()) <= 3, err      # one answer, not a traceback


def test_environment_values_from_set_are_exported_as_typed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    spec = files(tmp_path)["good"]
    sets = ["run.env.VER=1.10", "run.env.LR=3e-4", "run.env.MASK=0x10", "run.env.ON=true",
            "run.env.NAME=\"two words\""]
    assert cli.main(["render", str(spec), *sum((["--set", s] for s in sets), [])]) == 0
    script = capsys.readouterr().out
    for name, value in (("VER", "1.10"), ("LR", "3e-4"), ("MASK", "0x10"), ("ON", "true")):
        assert re.search(rf"\b{name}={value}\b", script), (name, script)
    assert "NAME='two words'" in script


def test_every_exit_code_is_in_one_table_in_help_and_docs(
        capsys: pytest.CaptureFixture[str]) -> None:
    codes = dict(errors.EXIT_CODES)
    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.HpctrainError)]
    assert {c.exit_code for c in classes} <= set(codes), "an error class's code is not listed"
    assert cli.main(["--help"]) == 0
    shown = capsys.readouterr().out
    docs = DOCS.read_text()
    for code, meaning in errors.EXIT_CODES:
        assert f"{code:>3}  {meaning}" in shown
        assert f"| {code} | {meaning} |" in docs


def test_a_value_with_control_characters_is_rendered_as_sent_and_shown_escaped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`render > file` is what `render -o` writes and `submit` sends, escape codes and all;
    on a terminal they are shown escaped, so none can hide a line of the script."""
    import subprocess
    import sys

    from hpctrain.commands.options import visible

    isolate(monkeypatch, tmp_path)
    spec = files(tmp_path)["good"]
    hide = ["--set", "run.env.TRICK=x\x1b[2K\rexport SAFE=1"]
    piped = subprocess.run([sys.executable, "-m", "hpctrain", "render", str(spec), *hide],
                           capture_output=True, timeout=60)
    assert piped.returncode == 0, piped.stderr
    written = tmp_path / "job.sbatch"
    assert cli.main(["render", str(spec), *hide, "-o", str(written)]) == 0
    assert piped.stdout == written.read_bytes() and b"\x1b[2K" in piped.stdout
    assert visible("x\x1b[2K\rexport\u202e\tok\n") == "x\\x1b[2K\\x0dexport\\u202e\tok\n"


@pytest.mark.parametrize("where,said", [
    ("file", "is a file: point it at a directory"),
    ("below", "lies below the file"),
    ("locked", "would be made in"),
])
def test_a_checkpoint_dir_the_job_could_not_use_is_refused_before_the_queue(
        where: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import os

    isolate(monkeypatch, tmp_path)
    (tmp_path / "a-file").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    ckpt = {"file": tmp_path / "a-file", "below": tmp_path / "a-file" / "ckpt",
            "locked": locked / "ckpt"}[where]
    spec = tmp_path / "job.toml"
    spec.write_text(spec_toml(**BASE, checkpoint={"dir": str(ckpt)}))
    if where == "locked" and os.access(locked, os.W_OK):
        said = "checkpoints"     # root may write anywhere: the dry run then goes ahead
    for argv in (["submit", str(spec), "--dry-run"], ["sweep", str(spec), "--dry-run",
                                                     "--grid", "run.env.X=1,2"]):
        got = cli.main(argv)
        out, err = capsys.readouterr()
        if said == "checkpoints":
            assert got == 0, err
            continue
        assert got == 2 and f"checkpoint.dir={str(ckpt)!r}" in err and said in err, err
    # nothing of it exists here (storage only the compute nodes mount): not judged
    spec.write_text(spec_toml(**BASE, checkpoint={"dir": "/nonexistent-scratch/me/ckpt"}))
    assert cli.main(["submit", str(spec), "--dry-run"]) == 0


def test_an_export_option_that_would_drop_the_passed_through_secrets_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    spec = tmp_path / "job.toml"
    run = {**BASE["run"], "env_passthrough": ["WANDB_API_KEY"]}
    for export, code in (("NONE", 2), ("PATH,HOME", 2), ("ALL", 0), ("WANDB_API_KEY,PATH", 0)):
        spec.write_text(spec_toml(**{**BASE, "run": run}, sbatch={"export": export}))
        assert cli.main(["submit", str(spec), "--dry-run"]) == code, export
        err = capsys.readouterr().err
        if code:
            assert f"[sbatch] export='{export}' keeps WANDB_API_KEY" in err, err
