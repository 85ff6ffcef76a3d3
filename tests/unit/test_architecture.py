"""The house's boundaries, enforced: who may import whom, and who may start processes.

One allow-list (:data:`MAY_IMPORT`) says, for each part of the package, which other parts
it may import; a part not in the table fails the test until somebody places it (new code
is not allowed by default). It is checked twice: on the source (every import statement,
also those inside functions) and on what a fresh interpreter really loads.

No module takes part in an import cycle, counting imports inside functions
(:func:`test_no_import_cycles`): what two modules share lives in a module below both.

The two sides (docs/architecture.md):

- login node: spec -> render -> jobs (submit, handle, poll, view) -> report, and the
  commands/cli/api on top; planner and devcluster beside them;
- in the job: runtime (every rank) -> checkpoint, and the supervisor (the batch step);
- shared by both: errors, files, hostlist, mesh, protocol (standard library only).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "hpctrain"

SHARED = {"hpctrain.errors", "hpctrain.files", "hpctrain.hostlist", "hpctrain.mesh",
          "hpctrain.protocol", "hpctrain.access"}
# part -> the parts (packages, modules, or one module of a package) it may import
MAY_IMPORT: dict[str, set[str]] = {
    "hpctrain": set(),                       # the package root: public names load lazily
    "hpctrain.__main__": {"hpctrain.cli"},
    "hpctrain.errors": set(),
    "hpctrain.files": set(),
    "hpctrain.access": set(),
    "hpctrain.hostlist": {"hpctrain.errors"},
    "hpctrain.mesh": {"hpctrain.errors"},
    "hpctrain.protocol": {"hpctrain.errors", "hpctrain.files"},
    # ---- in the job: imports nothing of the login side --------------------------------
    # the runtime closes the checkpoint managers (their background saves) before it exits;
    # a function job's wrapper hands submitit its requeue (the job runs submitit anyway)
    "hpctrain.runtime": SHARED | {"hpctrain.checkpoint.open_managers", "torch", "submitit"},
    # the manager tells the watchdog it is saving/loading (the rank's progress record)
    "hpctrain.checkpoint": SHARED | {"hpctrain.runtime.progress", "torch", "numpy",
                                     "safetensors", "deepspeed"},
    # the batch step: asks Slurm through hpctrain.slurm, knows the runtime's exit causes
    "hpctrain.supervisor": SHARED | {"hpctrain.slurm", "hpctrain.runtime"},
    "hpctrain.slurm": {"hpctrain.errors"},
    # in the job, inside a framework's loop: the runtime attached to the framework's group
    "hpctrain.integrations": {"hpctrain.runtime", "torch", "lightning", "transformers"},
    # ---- the login node ---------------------------------------------------------------
    # the spec checks the watchdog's timeouts against the defaults the supervisor applies
    "hpctrain.spec": {"hpctrain.errors", "hpctrain.mesh", "hpctrain.access",
                      "hpctrain.protocol"},
    "hpctrain.planner": {"hpctrain.errors", "hpctrain.mesh", "hpctrain.spec"},
    "hpctrain.render": SHARED | {"hpctrain.spec", "hpctrain.slurm", "jinja2"},
    # jobs.accounting gathers the report's inputs (report.build's and report.partition's)
    "hpctrain.jobs": SHARED | {"hpctrain.spec", "hpctrain.render", "hpctrain.slurm",
                               "hpctrain.runtime.function", "hpctrain.report", "submitit"},
    "hpctrain.report": {"hpctrain.errors"},
    "hpctrain.devcluster": {"hpctrain.errors", "hpctrain.files", "hpctrain.slurm"},
    "hpctrain.api": {"hpctrain.jobs", "hpctrain.spec", "hpctrain.runtime.function"},
    # --host: the client of the cluster's hpctrain (the job handle's contract, the views)
    "hpctrain.remote": SHARED | {"hpctrain.jobs", "hpctrain.spec", "hpctrain.slurm.states"},
    # --host's warm server, on the cluster: runs each request through the ordinary CLI
    "hpctrain.remote.server": SHARED | {"hpctrain.remote.frames", "hpctrain.cli"},
    "hpctrain.cli": {"hpctrain.errors", "hpctrain.commands.registry", "hpctrain.commands.remote",
                     "click"},
    "hpctrain.commands": SHARED | {"hpctrain.spec", "hpctrain.planner", "hpctrain.render",
                                   "hpctrain.jobs", "hpctrain.report", "hpctrain.slurm",
                                   "hpctrain.devcluster", "hpctrain.checkpoint",
                                   "hpctrain.remote", "hpctrain.cli", "click", "jinja2",
                                   "torch"},
}
THIRD_PARTY = ("torch", "numpy", "submitit", "jinja2", "click", "safetensors", "deepspeed",
               "lightning", "transformers")

# pure: no subprocess, no environment reads (files are read where the docstring says so)
PURE = ("hpctrain.spec.model", "hpctrain.spec.checks", "hpctrain.spec.layout",
        "hpctrain.spec.checkpoint",
        "hpctrain.spec.tomlwriter", "hpctrain.render.script", "hpctrain.planner",
        "hpctrain.jobs.sweep", "hpctrain.report", "hpctrain.devcluster.config",
        "hpctrain.devcluster.sshconf",
        "hpctrain.slurm.parse", "hpctrain.slurm.states", "hpctrain.slurm.view",
        "hpctrain.supervisor.decision", "hpctrain.supervisor.config",
        "hpctrain.supervisor.diagnosis", "hpctrain.supervisor.watchdog",
        "hpctrain.supervisor.lost", "hpctrain.supervisor.elastic", "hpctrain.supervisor.slow",
        "hpctrain.spec.health",
        "hpctrain.supervisor.runstate", "hpctrain.devcluster.strict", "hpctrain.hostlist",
        "hpctrain.mesh")
# modules allowed to start processes, and why
PROCESS_STARTERS = {
    "hpctrain.slurm.client": "the one runner of SLURM binaries",
    "hpctrain.devcluster.daemons": "starts munged/mariadbd/slurm daemons",
    "hpctrain.devcluster.packages": "apt-get",
    "hpctrain.devcluster.containers": "runc spec (the devcluster's host image)",
    "hpctrain.render.check": "bash -n on rendered scripts",
    "hpctrain.checkpoint.storage": "lfs setstripe on Lustre",
    "hpctrain.supervisor.step": "starts the training step (the launcher) in the batch step",
    "hpctrain.remote.ssh": "the one runner of ssh and rsync (--host)",
    "hpctrain.devcluster.sshd": "ssh-keygen, sshd -t, usermod (up --ssh)",
    "hpctrain.jobs.snapshot": "git: a snapshot's files and the submission's commit and diff",
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
            # `from a.b import c` uses a.b.c (a module or a name of a.b): judged as that
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def part_of(module: str) -> str | None:
    """The MAY_IMPORT key that ``module`` belongs to (the longest matching one)."""
    keys = [k for k in MAY_IMPORT if within(module, k) and k != "hpctrain"]
    return max(keys, key=len) if keys else ("hpctrain" if module == "hpctrain" else None)


def allowed(part: str, target: str) -> bool:
    if within(target, part) or target == "hpctrain":  # itself; `from hpctrain import x`
        return True
    return any(within(target, a) for a in MAY_IMPORT[part])


def relevant(name: str) -> bool:
    return within(name, "hpctrain") or any(within(name, t) for t in THIRD_PARTY)


def import_graph(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports: every import statement, also inside
    functions and ``if TYPE_CHECKING:``; ``from pkg import name`` is the submodule
    ``pkg.name`` when there is one, else ``pkg``. (A package's ``__init__`` that Python runs
    on the way to a submodule is not an edge: it is not what the statement names.)"""
    graph: dict[str, set[str]] = {}
    for mod, tree in trees.items():
        package = mod if _is_package(mod, trees) else mod.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets |= {_known(a.name, trees) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, package)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.add(sub if sub in trees else _known(base, trees))
        graph[mod] = {t for t in targets if t and t != mod}
    return graph


def _is_package(mod: str, trees: dict[str, ast.Module]) -> bool:
    return any(other.startswith(mod + ".") for other in trees)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` names, relative imports resolved."""
    if node.level == 0:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[:len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _known(name: str, trees: dict[str, ast.Module]) -> str:
    """The longest prefix of ``name`` that is one of the package's modules ('' for none)."""
    while name and name not in trees:
        name = name.rpartition(".")[0]
    return name


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) through each strongly connected set of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:   # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(_loop(min(group), group, graph))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _loop(start: str, group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from ``start`` back to itself inside ``group`` (breadth first)."""
    paths = {w: [start, w] for w in sorted(graph[start] & group)}
    queue = list(paths)
    while start not in paths:
        v = queue.pop(0)
        for w in sorted(graph[v] & group):
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return paths[start]


def test_no_import_cycles() -> None:
    found = cycles(import_graph(modules()))
    assert found == [], "import cycles (move what both sides need into a module below " \
        "both): " + "; ".join(" -> ".join(c) for c in found)


def test_the_cycle_finder_finds_cycles() -> None:
    trees = {name: ast.parse(text) for name, text in {
        "p": "", "p.a": "def f():\n    from p import b\n",   # inside a function
        "p.b": "from . import c\n", "p.c": "import p.a.x\n",   # relative; a name of p.a
        "p.d": "from p.a import f\n", "p.e": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from p import f\n", "p.f": "import p.e\n"}.items()}
    graph = import_graph(trees)
    assert graph["p.a"] == {"p.b"} and graph["p.b"] == {"p.c"} and graph["p.c"] == {"p.a"}
    assert graph["p.d"] == {"p.a"}
    assert cycles(graph) == [["p.a", "p.b", "p.c", "p.a"], ["p.e", "p.f", "p.e"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_every_part_is_placed() -> None:
    unplaced = sorted(m for m in modules() if part_of(m) is None)
    assert unplaced == [], "add these to MAY_IMPORT (and docs/architecture.md)"


def test_imports_follow_the_allow_list() -> None:
    problems = []
    for mod, tree in modules().items():
        part = part_of(mod)
        for target in sorted(imported(tree)):
            if target == "hpctrain.__version__":
                continue
            if relevant(target) and not allowed(part, target):
                problems.append(f"{mod} imports {target}")
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


# ---- what a fresh interpreter really loads ----------------------------------------------
def loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    return set(json.loads(out.stdout.splitlines()[-1]))


def outside(mods: set[str], *parts: str) -> list[str]:
    """The loaded hpctrain modules (and submitit) that none of ``parts`` may import."""
    return sorted(m for m in mods if (within(m, "hpctrain") or within(m, "submitit"))
                  and not any(allowed(part, m) for part in parts))


def test_runtime_loads_no_login_side_code_and_no_torch() -> None:
    mods = loaded_after("import hpctrain.runtime\nfrom hpctrain.runtime import init, CAUSES")
    assert outside(mods, "hpctrain.runtime") == []
    assert "torch" not in mods and "submitit" not in mods  # cheap for the batch script


@pytest.mark.torch
def test_runtime_and_checkpoint_in_use_load_no_login_side_code() -> None:
    mods = loaded_after(
        "import hpctrain.runtime.context, hpctrain.checkpoint\n"
        "from hpctrain.checkpoint import CheckpointManager\n"
        "import torch.distributed.device_mesh")
    assert "hpctrain.checkpoint.manager" in mods  # the probe did load it
    assert outside(mods, "hpctrain.runtime", "hpctrain.checkpoint") == []


def test_the_integrations_package_imports_no_framework() -> None:
    """``import hpctrain.integrations`` is free; each framework's module imports only its
    own framework, when the script imports that module."""
    mods = loaded_after("import hpctrain.integrations")
    assert not {"torch", "lightning", "transformers"} & mods
    assert outside(mods, "hpctrain.integrations") == []


def test_function_wrapper_loads_no_login_side_code() -> None:
    # every rank of a function job unpickles RankCall: it must not drag the login side in
    mods = loaded_after("import hpctrain.runtime.function")
    assert outside(mods, "hpctrain.runtime") == []
    assert "jinja2" not in mods and "click" not in mods


def test_supervisor_loads_only_its_allowed_parts() -> None:
    mods = loaded_after("import hpctrain.supervisor.run")
    assert outside(mods, "hpctrain.supervisor") == []
    assert "torch" not in mods


def test_checkpoint_loads_no_slurm_code() -> None:
    mods = loaded_after("import hpctrain.checkpoint, hpctrain.checkpoint.manifest")
    assert outside(mods, "hpctrain.checkpoint") == []


def test_the_checker_catches_what_it_should() -> None:
    assert not allowed("hpctrain.runtime", "hpctrain.jobs.submit")
    assert not allowed("hpctrain.checkpoint", "hpctrain.slurm.client")
    assert not allowed("hpctrain.checkpoint", "hpctrain.runtime.context")
    assert not allowed("hpctrain.supervisor", "hpctrain.render.script")
    assert not allowed("hpctrain.spec", "hpctrain.render")
    assert part_of("hpctrain.newthing") is None        # unplaced: test_every_part_is_placed
    assert allowed("hpctrain.checkpoint", "hpctrain.runtime.progress")


# ---- docs/architecture.md's table is this test's -------------------------------------------
DOC = PKG.parent / "docs" / "architecture.md"


def _doc_part(word: str) -> str:
    return "hpctrain" if word == "hpctrain" else f"hpctrain.{word}"


def documented_rules() -> tuple[set[str], dict[str, set[str]]]:
    """(shared, part -> what it may import) as docs/architecture.md's "What may import
    what" writes them."""
    text = DOC.read_text()
    section = text[text.index("## What may import what"):]
    section = section[:section.index("\n## ", 1)]
    shared_line = next(line for line in section.splitlines()
                       if line.startswith("*shared* below means "))
    shared = {_doc_part(w) for w in re.findall(r"`([^`]+)`", shared_line)}
    rules: dict[str, set[str]] = {}
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    for row in rows:
        parts_cell, allowed_cell = [c.strip() for c in row.strip("|").split("|")][:2]
        targets: set[str] = set()
        for item in re.split(r"[,;]", allowed_cell):
            item = item.strip()
            if item == "nothing":
                continue
            if item == "shared":
                targets |= shared
            elif item.startswith("`") and item.endswith("`"):
                targets.add(_doc_part(item.strip("`")))
            else:
                targets.add(item)              # a third-party package, by name
        for part in re.findall(r"`([^`]+)`", parts_cell):
            assert _doc_part(part) not in rules, f"{part} has two rows"
            rules[_doc_part(part)] = targets
    return shared, rules


def test_the_import_table_is_the_tests() -> None:
    shared, rules = documented_rules()
    assert shared == SHARED, "docs/architecture.md's *shared* differs from SHARED"
    assert sorted(rules) == sorted(MAY_IMPORT), "a part missing from one of the two"
    differ = {part: (sorted(rules[part]), sorted(MAY_IMPORT[part])) for part in MAY_IMPORT
              if rules[part] != MAY_IMPORT[part]}
    assert differ == {}, "docs/architecture.md (first) and MAY_IMPORT (second) differ"
