"""The recommended layout as a job spec (the TOML ``hpctrain render`` reads, see docs/spec.md).

Pure: builds a dict and its TOML text; the command writes the file. The plan's other
facts (ZeRO stage, recomputation, memory) go into a comment header, because the spec
has no fields for them and ``HPCTRAIN_*`` environment names are reserved for the
rendered script.
"""

from __future__ import annotations

import re
from typing import Any

from hpctrain.planner.core import Recommendation
from hpctrain.planner.sizes import gb, human_count
from hpctrain.spec.layout import plan_layout
from hpctrain.spec.model import JobSpec
from hpctrain.spec.partitions import Partition
from hpctrain.spec.resources import Requests, plan_requests
from hpctrain.spec.tomlwriter import dumps

DEFAULT_TIME = "24:00:00"  # when the partition has no finite max_time


def default_name(plan: Recommendation) -> str:
    """``train-70b``, ``qlora-13b``: a Slurm-safe job name from the mode and size."""
    w = plan.request.workload
    return re.sub(r"[^A-Za-z0-9._+-]", "-", f"{w.mode}-{human_count(w.params).lower()}")


def launcher_for(plan: Recommendation) -> str:
    """DeepSpeed when the plan uses a ZeRO stage, torchrun otherwise."""
    return "deepspeed" if plan.recommended.layout.zero >= 1 else "torchrun"


def spec_dict(plan: Recommendation, *, partition: str, name: str | None = None, time: str | None = None,
              command: list[str] | None = None, launcher: str | None = None,
              checkpoint_dir: str | None = None) -> dict[str, Any]:
    """The job spec for ``plan.recommended``, shaped like the TOML file."""
    best = plan.recommended
    lay = best.layout
    arch = plan.request.workload.arch
    spec: dict[str, Any] = {
        "name": name or default_name(plan),
        "partition": partition,
        "nodes": best.nodes,
        "gpus_per_node": best.gpus_per_node,
        "time": time or DEFAULT_TIME,
        "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp},
        "run": {"launcher": launcher or launcher_for(plan),
                "command": list(command or ["python", "train.py"])},
        "checkpoint": {"interval_steps": 100, "keep_last": 3},
        # the step's FLOPs for report's MFU, beside this plan's estimate
        "model": {"params": float(plan.request.workload.params),
                  "mode": plan.request.workload.mode},
    }
    # the divisibility checks `render` makes are only worth making on the real model's
    # figures: an assumed shape is left out (and named in the header instead)
    if "layers" in arch.given:
        spec["layout"]["num_layers"] = arch.layers
    if "heads" in arch.given:
        spec["layout"]["num_heads"] = arch.heads
    if checkpoint_dir:
        spec["checkpoint"] = {"dir": checkpoint_dir, **spec["checkpoint"]}
    return spec


def spec_toml(plan: Recommendation, spec: dict[str, Any]) -> str:
    """TOML text of ``spec`` with the plan summarised in a comment header."""
    best = plan.recommended
    lay = best.layout
    w = plan.request.workload
    header = [
        "# Written by `hpctrain plan` (docs/will-it-fit.md). Edit [run] command for your job.",
        f"# model: {human_count(w.params)} params, mode={w.mode}, seq_len={w.seq_len}, "
        f"micro_batch={w.micro_batch}",
        f"# plan: tp={lay.tp} pp={lay.pp} dp={lay.dp}, ZeRO stage {lay.zero}, "
        f"recompute={lay.recompute}, {gb(best.memory.total):g} of "
        f"{gb(best.capacity):g} GB per GPU, est. efficiency {best.efficiency['total']:.0%}",
    ]
    if w.arch.assumed:
        header.append(f"# note: {w.arch.assumed}; layout.num_layers/num_heads are written "
                      "only when given")
    return "\n".join(header) + "\n" + dumps(spec)


def requests_for(spec: dict[str, Any], partition: Partition) -> Requests:
    """What the job ``spec`` (:func:`spec_dict`) asks Slurm for on ``partition``: its
    GPUs, CPUs and memory, planned as ``hpctrain render`` plans them (checked as it checks
    them: a layout the partition refuses raises, naming the value)."""
    job = JobSpec.from_dict(spec)
    layout = plan_layout(job, partition)
    return plan_requests(job.resources, job.sbatch, partition=partition,
                         gpus_per_node=layout.gpus_per_node,
                         tasks_per_node=layout.tasks_per_node)
