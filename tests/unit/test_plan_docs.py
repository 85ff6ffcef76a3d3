"""docs/will-it-fit.md shows real `hpctrain plan` output: every example is re-run and compared.

Regenerate the outputs after changing the planner with:

    .venv/bin/python tests/unit/test_plan_docs.py
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "will-it-fit.md"
BLOCK = re.compile(r"```console\n\$ (hpctrain plan [^\n]*)\n(.*?)```", re.S)


def run_example(command: str) -> str:
    """What the user sees for ``command`` (stdout then stderr), as the doc shows it."""
    from hpctrain.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main(shlex.split(command)[1:])
    text = out.getvalue() + err.getvalue()
    return text if text.endswith("\n") else text + "\n"


def examples() -> list[tuple[str, str]]:
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


def test_the_doc_has_worked_examples_for_every_size() -> None:
    commands = " ".join(cmd for cmd, _ in examples())
    for size in ("7B", "13B", "70B", "175B"):
        assert f"--params {size} " in commands + " ", size


@pytest.mark.parametrize("command, shown", examples(), ids=[c for c, _ in examples()])
def test_doc_example_matches_a_fresh_run(command: str, shown: str) -> None:
    assert run_example(command) == shown, \
        "regenerate: .venv/bin/python tests/unit/test_plan_docs.py"


def regenerate() -> None:
    text = DOC.read_text(encoding="utf-8")
    text = BLOCK.sub(lambda m: f"```console\n$ {m.group(1)}\n{run_example(m.group(1))}```", text)
    DOC.write_text(text, encoding="utf-8")
    print(f"regenerated {len(examples())} examples in {DOC}", file=sys.stderr)


if __name__ == "__main__":
    regenerate()
