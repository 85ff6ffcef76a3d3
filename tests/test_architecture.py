"""The house's boundaries, enforced: who may import whom, and who may start processes.

- in-job code (hpctrain.runtime, hpctrain.checkpoint) imports nothing from submission code;
- the job supervisor (in-job, on the batch node) asks Slurm through hpctrain.slurm and
  imports nothing else from the submission side;
- checkpoint code imports nothing from SLURM code;
- planning and rendering are pure: no subprocess, no environment reads;
- only a short list of modules may start processes, and SLURM binaries run only
  through hpctrain.slurm.client.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "hpctrain"

SUBMISSION_SIDE = ("hpctrain.slurm", "hpctrain.devcluster", "hpctrain.submission",
                   "hpctrain.render", "hpctrain.spec", "hpctrain.commands", "hpctrain.cli",
                   "hpctrain.api", "hpctrain.job", "hpctrain.watcher", "hpctrain.sweep",
                   "hpctrain.records", "submitit")
FORBIDDEN = {
    "hpctrain.checkpoint": SUBMISSION_SIDE,
    "hpctrain.runtime": (*SUBMISSION_SIDE, "hpctrain.supervisor"),
    "hpctrain.supervisor": tuple(s for s in SUBMISSION_SIDE if s != "hpctrain.slurm"),
    "hpctrain.protocol": (*SUBMISSION_SIDE, "hpctrain.runtime", "hpctrain.supervisor"),
}
PURE = ("hpctrain.layout", "hpctrain.render", "hpctrain.spec", "hpctrain.planner",
        "hpctrain.sweep", "hpctrain.devcluster.config", "hpctrain.slurm.parse",
        "hpctrain.slurm.states", "hpctrain.slurm.view", "hpctrain.supervisor.decision", "hpctrain.supervisor.config",
        "hpctrain.supervisor.diagnosis", "hpctrain.supervisor.watchdog")
# modules allowed to start processes, and why
PROCESS_STARTERS = {
    "hpctrain.slurm.client": "the one runner of SLURM binaries",
    "hpctrain.devcluster.daemons": "starts munged/mariadbd/slurm daemons",
    "hpctrain.devcluster.packages": "apt-get",
    "hpctrain.template_check": "bash -n on rendered scripts",
    "hpctrain.checkpoint.storage": "lfs setstripe on Lustre",
    "hpctrain.supervisor.step": "starts the training step (the launcher) in the batch step",
}


def modules() -> dict[str, ast.Module]:
    found = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = ast.parse(path.read_text(), str(path))
    return found


def imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_in_job_code_does_not_import_submission_code() -> None:
    problems = []
    for mod, tree in modules().items():
        for area, banned in FORBIDDEN.items():
            if within(mod, area):
                problems += [f"{mod} imports {imp}" for imp in imported(tree)
                             if any(within(imp, b) for b in banned)]
    assert problems == []


def test_planning_and_rendering_are_pure() -> None:
    problems = []
    for mod, tree in modules().items():
        if any(within(mod, p) for p in PURE):
            imps = imported(tree)
            problems += [f"{mod} imports {i}" for i in imps
                         if within(i, "subprocess") or within(i, "hpctrain.slurm.client")]
            problems += [f"{mod} reads os.environ (line {n.lineno})" for n in ast.walk(tree)
                         if isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv")]
    assert problems == []


def test_only_known_modules_start_processes() -> None:
    starters = {mod for mod, tree in modules().items()
                if any(within(i, "subprocess") for i in imported(tree))
                or any(isinstance(n, ast.Attribute) and n.attr in ("system", "popen", "execvp")
                       and isinstance(n.value, ast.Name) and n.value.id == "os"
                       for n in ast.walk(tree))}
    assert starters - set(PROCESS_STARTERS) == set(), "add to PROCESS_STARTERS with a reason"


def test_no_shell_strings() -> None:
    offenders = [mod for mod, tree in modules().items() for n in ast.walk(tree)
                 if isinstance(n, ast.keyword) and n.arg == "shell"
                 and isinstance(n.value, ast.Constant) and n.value.value is True]
    assert offenders == []
