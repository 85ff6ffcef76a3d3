"""``[resources]``: the CPUs and memory a job asks Slurm for, and the plan of those requests.

Real sites count CPUs and memory per job. A script that asks only for nodes, tasks and GPUs
gets one CPU per task and the site's ``DefMemPerCPU`` (often a few GB per node): DataLoader
workers and NCCL's threads starve, and a large model is killed for memory. So every job asks
for its share of each node, from the partition's facts, in Slurm's own terms:

- CPUs per task: a task's share of the node's CPUs by the GPUs it drives (one task per GPU
  under srun and deepspeed: CPUs / GPUs; torchrun's one task per node: the CPUs of the
  GPUs it uses). Asked for in ``#SBATCH`` **and** on the srun that starts the ranks: Slurm
  22.05 to 23.02's srun does not inherit ``--cpus-per-task`` from the batch job.
- memory per node: the node's memory when the job uses all its GPUs (``--mem=0``: all of it,
  whatever the exact figure), else the GPUs' share (in MiB, Slurm's unit); ``--mem=0`` with
  ``exclusive`` too, which alone does not give a job the node's memory.
- a typed GPU request (``--gpus-per-node=h100:8``) when the facts name the GRES type.

A spec may set each itself. Everything here is pure arithmetic on the spec and the facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from hpctrain.errors import LayoutError, SpecError
from hpctrain.spec.checks import check_table

MAX_CPUS_PER_TASK = 4096
# sbatch options of the same kind as a request planned here: when [sbatch] names one, the
# planned request of that kind is left out (Slurm refuses --mem with --mem-per-cpu, say)
CPU_OPTIONS = ("cpus-per-gpu", "mincpus")
MEM_OPTIONS = ("mem-per-cpu",)


def _positive(value: Any, where: str, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SpecError(f"{where}={value!r} must be a number above 0 (e.g. {where} = {example})")
    return float(value)


@dataclass(frozen=True)
class ResourceSpec:
    """What a spec says about CPUs and memory; every key is optional (None: from the facts).

    ``cpus_per_task``: CPUs for each Slurm task (a rank under srun/deepspeed, a node's
    ranks under torchrun). ``mem_per_node_gb`` or ``mem_per_gpu_gb`` (not both): memory in
    GiB. ``exclusive``: the nodes are the job's alone (``--exclusive``, and ``--mem=0``
    unless memory is given)."""

    cpus_per_task: int | None = None
    mem_per_node_gb: float | None = None
    mem_per_gpu_gb: float | None = None
    exclusive: bool = False

    @classmethod
    def from_dict(cls, data: Any) -> "ResourceSpec":
        d = check_table(data, "resources", cls)
        cpus = d.get("cpus_per_task")
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int)
                                 or not 1 <= cpus <= MAX_CPUS_PER_TASK):
            raise SpecError(f"resources.cpus_per_task={cpus!r} must be a whole number "
                            f"1..{MAX_CPUS_PER_TASK} (e.g. resources.cpus_per_task = 8)")
        node = d.get("mem_per_node_gb")
        gpu = d.get("mem_per_gpu_gb")
        if node is not None and gpu is not None:
            raise SpecError("resources.mem_per_node_gb and resources.mem_per_gpu_gb are both "
                            "set: keep one (Slurm takes memory per node or per GPU, not both)")
        exclusive = d.get("exclusive", False)
        if not isinstance(exclusive, bool):
            raise SpecError(f"resources.exclusive={exclusive!r} must be true or false")
        return cls(cpus_per_task=cpus,
                   mem_per_node_gb=None if node is None else _positive(
                       node, "resources.mem_per_node_gb", "512"),
                   mem_per_gpu_gb=None if gpu is None else _positive(
                       gpu, "resources.mem_per_gpu_gb", "64"),
                   exclusive=exclusive)


@dataclass(frozen=True)
class Requests:
    """The CPU, memory and GPU requests of one job, as sbatch and srun options.

    ``cpus_per_task`` None: no CPU request (the spec's [sbatch] table has one of its own);
    ``memory`` None likewise; else ("mem", "0"), ("mem", "2048M") or ("mem-per-gpu", ...)."""

    cpus_per_task: int | None
    memory: tuple[str, str] | None
    gpus: tuple[str, str]                 # ("gpus-per-node", "h100:8") or ("gres", "gpu:8")
    exclusive: bool = False
    why: str = ""                         # one line: where the figures come from

    def describe(self) -> str:
        """One line for the dry run: each request as sbatch writes it, and why."""
        words = " ".join(f"--{k}" + ("" if v is None else f"={v}") for k, v in self.directives())
        return f"requests: {words} ({self.why})"

    def to_json(self) -> dict[str, Any]:
        return {"cpus_per_task": self.cpus_per_task, "gpus": "=".join(self.gpus),
                "memory": "=".join(self.memory) if self.memory else None,
                "exclusive": self.exclusive, "why": self.why}

    def directives(self) -> list[tuple[str, str | None]]:
        """The ``#SBATCH`` options, in script order (the GPUs first)."""
        opts: list[tuple[str, str | None]] = [self.gpus]
        if self.cpus_per_task is not None:
            opts.append(("cpus-per-task", str(self.cpus_per_task)))
        if self.memory is not None:
            opts.append(self.memory)
        if self.exclusive:
            opts.append(("exclusive", None))
        return opts


def _mib(gb: float) -> str:
    return f"{max(1, int(gb * 1024))}M"


def plan_requests(res: ResourceSpec, sbatch: Mapping[str, str | None], *, partition: Any,
                  gpus_per_node: int, tasks_per_node: int) -> Requests:
    """The requests of a job using ``gpus_per_node`` GPUs of each node of ``partition``
    (its facts: gpus_per_node, cpus_per_node, mem_per_node_gb, gres_type, gpu_request)
    through ``tasks_per_node`` Slurm tasks; ``sbatch`` is the spec's [sbatch] table."""
    node_gpus = partition.gpus_per_node
    whole = gpus_per_node >= node_gpus
    share = f"{gpus_per_node} of {node_gpus} GPUs" if not whole else "every GPU"
    cpus = res.cpus_per_task
    if cpus is None and not any(k in sbatch for k in CPU_OPTIONS):
        node_cpus = partition.cpus_per_node * gpus_per_node // max(node_gpus, 1)
        cpus = max(1, node_cpus // tasks_per_node) if partition.cpus_per_node else None
    if cpus is not None and partition.cpus_per_node and cpus * tasks_per_node > \
            partition.cpus_per_node:
        raise LayoutError(
            f"resources.cpus_per_task={cpus} x {tasks_per_node} task(s) per node = "
            f"{cpus * tasks_per_node} CPUs exceeds partition {partition.name!r}'s "
            f"{partition.cpus_per_node} per node: use cpus_per_task <= "
            f"{partition.cpus_per_node // tasks_per_node}")
    return Requests(cpus_per_task=cpus, memory=_memory(res, sbatch, partition, whole,
                                                       gpus_per_node),
                    gpus=_gpus(partition, gpus_per_node), exclusive=res.exclusive,
                    why=f"{share} of each node; a {partition.name} node has "
                        f"{partition.cpus_per_node} CPUs and {partition.mem_per_node_gb:g} GB")


def _memory(res: ResourceSpec, sbatch: Mapping[str, str | None], partition: Any,
            whole: bool, gpus: int) -> tuple[str, str] | None:
    if res.mem_per_gpu_gb is not None:
        return "mem-per-gpu", _mib(res.mem_per_gpu_gb)
    if res.mem_per_node_gb is not None:
        if partition.mem_per_node_gb and res.mem_per_node_gb > partition.mem_per_node_gb:
            raise LayoutError(
                f"resources.mem_per_node_gb={res.mem_per_node_gb:g} exceeds partition "
                f"{partition.name!r}'s {partition.mem_per_node_gb:g} GB per node: ask for "
                f"less, or leave it out for the GPUs' share")
        return "mem", _mib(res.mem_per_node_gb)
    if any(k in sbatch for k in MEM_OPTIONS):
        return None
    if whole or res.exclusive:
        return "mem", "0"          # all of each node's memory, whatever the exact figure
    if not partition.mem_per_node_gb:
        return None                # not known: the site's default per CPU applies
    return "mem", _mib(partition.mem_per_node_gb * gpus / partition.gpus_per_node)


def _gpus(partition: Any, count: int) -> tuple[str, str]:
    typed = f"{partition.gres_type}:{count}" if partition.gres_type else str(count)
    if partition.gpu_request == "gres":
        return "gres", f"gpu:{typed}"
    return "gpus-per-node", typed
