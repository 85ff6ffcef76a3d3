"""The contract with submitit: what RenderedExecutor overrides or calls of its private API.

hpctrain.jobs.executor.RenderedExecutor subclasses submitit's SlurmExecutor, replaces its
submission-file hook and mirrors ``PicklingExecutor._submit_command`` step by step (to run
sbatch through hpctrain.slurm.client). Private members change without notice, so setup.cfg
pins the versions these tests (and the cluster tests) passed on, and this file fails on
a submitit that no longer has the shape the mirror assumes: then re-read upstream's
``_submit_command``, mirror it, and widen the pin.
"""

from __future__ import annotations

import ast
import configparser
import inspect
import re
import textwrap
from importlib import metadata
from pathlib import Path

import submitit
from submitit.core.core import PicklingExecutor
from submitit.core.utils import JobPaths

from hpctrain.jobs.executor import RenderedExecutor

ROOT = Path(__file__).resolve().parents[2]
# the calls upstream's _submit_command makes, as of the pinned versions; ours makes the
# same ones except CommandFunction/_make_submission_command/_get_job_id_... (sbatch runs
# through hpctrain.slurm.client and parse_sbatch_parsable instead)
UPSTREAM_STEPS = {"uuid4", "get_first_id_independent_folder", "open", "write",
                  "_make_submission_file_text", "_make_submission_command", "CommandFunction",
                  "_get_job_id_from_submission_command", "_num_tasks", "job_class",
                  "move_temporary_file", "_write_job_id", "_set_job_permissions"}
REPLACED = {"open", "write", "_make_submission_command", "CommandFunction",
            "_get_job_id_from_submission_command"}


def calls_in(func: object) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return {n.func.attr for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}


def pinned_range() -> tuple[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    line = next(ln for ln in cfg["options"]["install_requires"].splitlines()
                if ln.strip().startswith("submitit"))
    m = re.fullmatch(r"submitit>=([\d.]+),<([\d.]+)", line.strip())
    assert m, f"submitit must be pinned to a range (>=low,<high), not {line.strip()!r}"
    return m.group(1), m.group(2)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def test_installed_submitit_is_in_the_pinned_range() -> None:
    low, high = pinned_range()
    have = version_tuple(metadata.version("submitit"))
    assert version_tuple(low) <= have < version_tuple(high)


def test_upstream_submit_command_still_has_the_steps_we_mirror() -> None:
    assert calls_in(PicklingExecutor._submit_command) == UPSTREAM_STEPS, (
        "submitit's _submit_command changed: mirror it in RenderedExecutor._submit_command")
    ours = calls_in(RenderedExecutor._submit_command)
    assert UPSTREAM_STEPS - REPLACED <= ours


def test_members_we_override_or_call_have_the_signatures_we_use() -> None:
    def params(func: object) -> list[str]:
        return list(inspect.signature(func).parameters)

    slurm = submitit.SlurmExecutor
    assert params(slurm._make_submission_file_text) == ["self", "command", "uid"]
    assert params(slurm._num_tasks) == ["self"]
    assert params(PicklingExecutor._submit_command) == ["self", "command"]
    assert params(PicklingExecutor._write_job_id) == ["self", "job_id", "uid"]
    assert params(PicklingExecutor._set_job_permissions) == ["folder"]
    assert isinstance(inspect.getattr_static(slurm, "_submitit_command_str"), property)
    assert params(slurm.job_class) == ["folder", "job_id", "tasks"]
    assert params(JobPaths.get_first_id_independent_folder) == ["folder"]
    assert params(JobPaths.move_temporary_file) == ["self", "tmp_path", "name",
                                                    "keep_as_symlink"]


def test_the_submission_file_is_the_rendered_script(tmp_path: Path, monkeypatch) -> None:
    # the hook itself, without a cluster (the cluster tests submit for real)
    monkeypatch.setattr("hpctrain.slurm.client.have", lambda name: True)
    executor = RenderedExecutor(tmp_path, "#!/bin/bash\necho rendered\n", 4)
    assert executor._make_submission_file_text("ignored", "uid") == "#!/bin/bash\necho rendered\n"
    assert executor._num_tasks() == 4
