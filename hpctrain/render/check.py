"""``hpctrain templates check``: render every partition x launcher x layout and test it.

Each case is rendered (pure), syntax-checked with ``bash -n``, checked to end with the
supervisor's hand-over and, with ``slurm=True``,
handed to ``sbatch --test-only`` on the live cluster (through hpctrain.slurm.client),
which validates the directives against the real partitions without queueing anything.
With ``slurm=True`` a partition's container runtime is checked to be there too.
This is the one module of the render side that starts processes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from hpctrain.errors import HpctrainError
from hpctrain.spec.checks import slurm_time_seconds
from hpctrain.spec.model import LAUNCHERS, JobSpec
from hpctrain.spec.partitions import Partition, partitions_in

BASH_TIMEOUT_S = 10.0
SBATCH_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CheckCase:
    """One spec to render: a partition, a launcher and a named layout."""

    label: str
    spec: JobSpec


@dataclass(frozen=True)
class CheckResult:
    case: CheckCase
    ok: bool
    stage: str        # render | bash -n | sbatch --test-only | ok
    message: str = ""


def sample_layouts(part: Partition) -> list[tuple[str, int, int, int]]:
    """(label, nodes, tp, pp) covering DP, TP, PP and all three on this partition."""
    g = part.gpus_per_node
    n = min(2, part.max_nodes or 2)
    tp2 = 2 if g % 2 == 0 else 1
    cands = [("dp", n, 1, 1), ("tp", 1, g, 1), ("pp", n, 1, min(2, n * g)),
             ("tp+pp+dp", n, tp2, 2 if n * g // tp2 >= 2 else 1)]
    seen, out = set(), []
    for label, nodes, tp, pp in cands:
        if (nodes, tp, pp) not in seen:
            seen.add((nodes, tp, pp))
            out.append((label, nodes, tp, pp))
    return out


def check_cases(partitions: Sequence[Partition]) -> list[CheckCase]:
    """The matrix: every partition x launcher x :func:`sample_layouts` layout, and on a
    partition with a container runtime every launcher it can run in a container."""
    cases = []
    for part in partitions:
        limit = slurm_time_seconds(part.max_time)
        minutes = 10 if limit is None else max(1, min(10, limit // 60))
        facts = part.container
        for launcher in LAUNCHERS:
            layouts = [] if facts is not None and facts.required else sample_layouts(part)
            for label, nodes, tp, pp in layouts:
                spec = _case_spec(part, launcher, label, nodes, tp, pp, minutes)
                cases.append(CheckCase(f"{part.name:10} {launcher:9} {label:9} "
                                       f"nodes={nodes} tp={tp} pp={pp}", spec))
            if facts is None or (facts.runtime == "oci" and launcher != "torchrun"):
                continue  # Slurm's OCI containers: torchrun only (spec/container.py)
            image = (facts.image_prefixes[0] if facts.image_prefixes else "/images/") + "check"
            spec = _case_spec(part, launcher, "container", 1, 1, 1, minutes,
                              {"image": image, "mounts": ["/tmp:/scratch"]})
            cases.append(CheckCase(f"{part.name:10} {launcher:9} in a {facts.runtime} "
                                   "container", spec))
    return cases


def _case_spec(part: Partition, launcher: str, label: str, nodes: int, tp: int, pp: int,
               minutes: int, container: dict | None = None) -> JobSpec:
    name = f"check-{part.name}-{launcher}-{label.replace('+', '-')}"
    data = {"name": name, "partition": part.name, "nodes": nodes, "time": str(minutes),
            "layout": {"tp": tp, "pp": pp},
            "run": {"launcher": launcher, "command": ["python", "train.py", "--steps", "10"],
                    "setup": ["true"], "env": {"OMP_NUM_THREADS": "1"}},
            "checkpoint": {"dir": f"/tmp/hpctrain-check/{name}", "stripe_count": 2},
            "requeue": {"signal_lead_s": min(30, minutes * 60 - 1)}}
    if container is not None:
        data["container"] = container
    return JobSpec.from_dict(data)


def runtime_error(part: Partition) -> str | None:
    """None when the partition's container runtime is there (asked of the live cluster and
    this node), else what is missing and how to get it."""
    from hpctrain.slurm import client
    from hpctrain.slurm.parse import parse_scontrol_config

    facts = part.container
    if facts is None:
        return None
    if facts.runtime == "apptainer":
        return None if shutil.which(facts.apptainer) else (
            f"{facts.apptainer!r} is not on PATH here: install Apptainer (or set "
            "container.apptainer to the site's binary, e.g. singularity)")
    usage = client.run(["srun", "--help"], check=False, timeout=SBATCH_TIMEOUT_S)
    help_text = usage.stdout + usage.stderr
    if facts.runtime == "pyxis":
        return None if "--container-image" in help_text else (
            "srun --help lists no --container-image: the pyxis SPANK plugin is not loaded "
            "(plugstack.conf) on this cluster")
    if not re.search(r"^\s*--container\b(?!-)", help_text, re.M):
        return "srun --help lists no --container: this Slurm has no OCI support (21.08+)"
    conf = parse_scontrol_config(client.run(["scontrol", "show", "config"],
                                            timeout=SBATCH_TIMEOUT_S).stdout).get("SLURM_CONF")
    if conf and not (Path(conf).parent / "oci.conf").is_file():
        return (f"no oci.conf beside {conf}: slurmstepd cannot run containers (write one "
                "with RunTimeQuery/RunTimeRun/RunTimeKill/RunTimeDelete, see docs/containers.md)")
    return None


def bash_syntax_error(script: str) -> str | None:
    """None when ``bash -n`` accepts the script, else bash's message."""
    bash = shutil.which("bash")
    if bash is None:
        return "bash not found on PATH"
    proc = subprocess.run([bash, "-n"], input=script, capture_output=True, text=True,
                          timeout=BASH_TIMEOUT_S)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


def handover_error(script: str) -> str | None:
    """None when the script ends by handing the batch step to the supervisor, as
    base.sbatch.j2 does; else what is wrong (a site template dropped or broke it)."""
    from hpctrain.render.script import SUPERVISOR_MODULE

    lines = script.rstrip().splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("exec ")
              and f"-m {SUPERVISOR_MODULE} --" in ln]
    if len(starts) != 1:
        return (f"the script must end with `exec PYTHON -m {SUPERVISOR_MODULE} -- LAUNCHER ...` "
                f"once (found {len(starts)}): keep base.sbatch.j2's hand-over; without it no "
                "supervisor requeues the job")
    tail = lines[starts[0]:]
    if any(not ln.rstrip().endswith("\\") for ln in tail[:-1]):
        return "the supervisor's hand-over must be the script's last command: lines follow it"
    if tail[-1].rstrip().endswith("&"):
        return ("the launcher command ends with '&': a launcher template now gives the words "
                "of the step only (the supervisor starts it)")
    return None


def sbatch_test_only_error(script: str) -> str | None:
    """None when ``sbatch --test-only`` accepts the script on the live cluster."""
    from hpctrain.slurm import client

    res = client.run(["sbatch", "--test-only"], input=script, check=False,
                     timeout=SBATCH_TIMEOUT_S)
    return None if res.returncode == 0 else (res.stderr.strip() or res.stdout.strip()
                                             or f"exit {res.returncode}")


def check_one(case: CheckCase, dirs: Sequence[Path], slurm: bool,
              partition: Partition | None = None, devcluster: bool = True) -> CheckResult:
    from hpctrain.render.script import render

    try:
        script = render(case.spec, dirs, partition=partition, devcluster=devcluster).script
    except HpctrainError as exc:
        return CheckResult(case, False, "render", str(exc))
    err = bash_syntax_error(script)
    if err:
        return CheckResult(case, False, "bash -n", err)
    err = handover_error(script)
    if err:
        return CheckResult(case, False, "hand-over", err)
    if slurm:
        err = sbatch_test_only_error(script)
        if err:
            return CheckResult(case, False, "sbatch --test-only", err)
    return CheckResult(case, True, "ok")


def run_checks(dirs: Sequence[Path], slurm: bool = False,
               partitions: Sequence[Partition] | None = None,
               devcluster: bool = True) -> list[CheckResult]:
    """Check every case on the search path ``dirs``; never raises for a failing case.

    ``partitions``: the facts to check (the site's files over Slurm's word, from the
    caller); None: the facts files on ``dirs``. ``devcluster``: see render.script.render."""
    try:
        parts = list(partitions) if partitions is not None else partitions_in(dirs)
    except HpctrainError as exc:
        bad = CheckCase("partition facts", _placeholder())
        return [CheckResult(bad, False, "partitions", str(exc))]
    by_name = {p.name: p for p in parts} if partitions is not None else {}
    skipped = [CheckResult(CheckCase(f"{p.name:10} (no GPUs: hpctrain jobs cannot run here)",
                                     _placeholder()), True, "skipped")
               for p in parts if p.gpus_per_node < 1]
    gpu_parts = [p for p in parts if p.gpus_per_node >= 1]
    runtimes = []
    for part in gpu_parts if slurm else []:
        if part.container is not None:
            err = runtime_error(part)
            case = CheckCase(f"{part.name:10} container runtime {part.container.runtime}",
                             _placeholder())
            runtimes.append(CheckResult(case, err is None, "runtime" if err else "ok",
                                        err or ""))
    return skipped + runtimes + [check_one(case, dirs, slurm, by_name.get(case.spec.partition),
                                           devcluster) for case in check_cases(gpu_parts)]


def _placeholder() -> JobSpec:
    return JobSpec.from_dict({"name": "none", "partition": "none", "run": {"command": ["true"]}})


def format_report(results: Sequence[CheckResult]) -> str:
    """One line per case, failures with the stage and message; a summary at the end."""
    lines = []
    for r in results:
        if r.stage == "skipped":
            lines.append(f"skip  {r.case.label}")
        elif r.ok:
            lines.append(f"ok    {r.case.label}")
        else:
            detail = r.message.replace("\n", "\n        ")
            lines.append(f"FAIL  {r.case.label}\n      {r.stage}: {detail}")
    bad = sum(not r.ok for r in results)
    skipped = sum(r.stage == "skipped" for r in results)
    lines.append(f"{len(results) - bad - skipped} passed, {bad} failed"
                 + (f", {skipped} partition(s) skipped" if skipped else ""))
    return "\n".join(lines)
