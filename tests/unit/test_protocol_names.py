"""The names processes share are written once: every ``HPCTRAIN_*`` environment name is a
constant (those the sides share in hpctrain.protocol), and the one integer reader."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from hpctrain import protocol
from hpctrain.errors import SpecError

PKG = Path(__file__).resolve().parents[2] / "hpctrain"
NAME = re.compile(r"HPCTRAIN_[A-Z][A-Z0-9_]*")


def _module_constants(tree: ast.Module) -> set[int]:
    """ids of the string constants that are a module-level ``NAME = "..."``'s value."""
    return {id(node.value) for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, ast.Constant)}


def test_every_hpctrain_name_is_one_constant() -> None:
    """Outside hpctrain.protocol a literal ``HPCTRAIN_X`` is only a module's own constant
    (a name one side alone reads: the login side's directories, the devcluster's); and no
    name is written twice anywhere."""
    where: dict[str, list[str]] = defaultdict(list)
    loose = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).as_posix()
        tree = ast.parse(path.read_text(), rel)
        owned = _module_constants(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and NAME.fullmatch(node.value):
                where[node.value].append(f"{rel}:{node.lineno}")
                if not rel.startswith("hpctrain/protocol/") and id(node) not in owned:
                    loose.append(f"{rel}:{node.lineno} {node.value}")
    assert loose == [], "use hpctrain.protocol's constant (or the module's own)"
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert twice == {}


def test_the_checker_sees_the_script_exports() -> None:
    assert protocol.WORLD_SIZE == "HPCTRAIN_WORLD_SIZE" and protocol.TP == "HPCTRAIN_TP"


@pytest.mark.parametrize("raw, want", [(None, 5), ("", 5), ("  ", 5), ("12", 12),
                                       (" 3 ", 3), ("-1", -1)])
def test_env_int_reads_or_defaults(raw: str | None, want: int) -> None:
    env = {} if raw is None else {"HPCTRAIN_X": raw}
    assert protocol.env_int(env, "HPCTRAIN_X", 5) == want


def test_env_int_names_the_variable_and_the_fix() -> None:
    with pytest.raises(SpecError, match=r"^HPCTRAIN_X='4x' is not a whole number: do Y$"):
        protocol.env_int({"HPCTRAIN_X": "4x"}, "HPCTRAIN_X", 0, error=SpecError, fix="do Y")
    with pytest.raises(ValueError, match="HPCTRAIN_X='1.5'"):
        protocol.env_int({"HPCTRAIN_X": "1.5"}, "HPCTRAIN_X", 0)
    # a reader that must not fail: garbage counts as unset; None: "not given"
    assert protocol.env_int({"HPCTRAIN_X": "4x"}, "HPCTRAIN_X", 7, error=None) == 7
    assert protocol.env_int({}, "HPCTRAIN_X", None) is None


def test_the_three_readers_are_the_one() -> None:
    """The supervisor's settings, the runtime's layout and the checkpoint manager's
    defaults each fail with their own error and fix, through env_int."""
    from hpctrain.checkpoint.settings import resolve
    from hpctrain.errors import CheckpointError, SupervisorError
    from hpctrain.runtime.environment import Environment
    from hpctrain.supervisor.config import Config

    with pytest.raises(SupervisorError, match="HPCTRAIN_MAX_REQUEUES='x' is not a whole "
                                              "number: render the script again"):
        Config.from_env(["srun"], {"SLURM_JOB_ID": "1", "HPCTRAIN_MAX_REQUEUES": "x"})
    with pytest.raises(SpecError, match="HPCTRAIN_TP='x' is not a whole number"):
        Environment.from_env({"HPCTRAIN_TP": "x"})
    with pytest.raises(CheckpointError, match="HPCTRAIN_CKPT_KEEP_LAST='x' is not a whole "
                                              "number: the rendered script"):
        resolve("/tmp/ckpt", env={"HPCTRAIN_CKPT_KEEP_LAST": "x"})
