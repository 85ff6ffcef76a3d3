"""CPU, memory and GPU requests: what a job asks Slurm for, from the partition's facts
(hpctrain.spec.resources), in #SBATCH and on the srun that starts the ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import LayoutError, SpecError
from hpctrain.render.script import render_script
from hpctrain.spec.model import JobSpec
from hpctrain.spec.partitions import Partition
from hpctrain.spec.resources import ResourceSpec, plan_requests

H100 = Partition(name="gpu", gpus_per_node=8, cpus_per_node=96, mem_per_node_gb=1000,
                 gres_type="h100")


def requests(partition: Partition = H100, gpus: int = 8, tasks: int = 8,
             sbatch: dict | None = None, **res: object):
    return plan_requests(ResourceSpec.from_dict(res), sbatch or {}, partition=partition,
                         gpus_per_node=gpus, tasks_per_node=tasks)


@pytest.mark.parametrize("gpus, tasks, cpus, mem", [
    (8, 8, 12, ("mem", "0")),          # srun/deepspeed, whole node: 96 / 8 per rank
    (8, 1, 96, ("mem", "0")),          # torchrun, whole node: one task with every CPU
    (2, 2, 12, ("mem", "256000M")),    # 2 of 8 GPUs: a quarter of the node
    (2, 1, 24, ("mem", "256000M")),    # torchrun on 2 GPUs: their CPUs in one task
])
def test_a_job_asks_for_its_gpus_share_of_each_node(gpus, tasks, cpus, mem) -> None:
    got = requests(gpus=gpus, tasks=tasks)
    assert (got.cpus_per_task, got.memory) == (cpus, mem)
    assert got.gpus == ("gpus-per-node", f"h100:{gpus}")      # typed: the facts name it


def test_the_spec_may_set_each_request() -> None:
    got = requests(cpus_per_task=4, mem_per_node_gb=512)
    assert (got.cpus_per_task, got.memory) == (4, ("mem", "524288M"))
    assert requests(mem_per_gpu_gb=64).memory == ("mem-per-gpu", "65536M")
    exclusive = requests(gpus=2, tasks=2, exclusive=True)
    assert exclusive.memory == ("mem", "0") and exclusive.exclusive     # --exclusive alone
    assert ("exclusive", None) in exclusive.directives()              # gives no memory


def test_an_sbatch_option_of_the_same_kind_takes_over() -> None:
    got = requests(sbatch={"mem-per-cpu": "4G", "cpus-per-gpu": "10"})
    assert (got.cpus_per_task, got.memory) == (None, None)
    assert [k for k, _ in got.directives()] == ["gpus-per-node"]


def test_untyped_and_gres_requests() -> None:
    plain = Partition(name="p", gpus_per_node=4, cpus_per_node=0, mem_per_node_gb=0)
    got = requests(plain, gpus=4, tasks=4)
    assert got.gpus == ("gpus-per-node", "4")
    assert got.cpus_per_task is None     # the facts know no CPUs: nothing asked
    assert got.memory == ("mem", "0")    # every GPU: the node's memory, whatever it is
    assert requests(plain, gpus=2, tasks=2).memory is None       # share of an unknown
    gres = Partition(name="g", gpus_per_node=8, cpus_per_node=96, mem_per_node_gb=1000,
                     gres_type="h100", gpu_request="gres")
    assert requests(gres).gpus == ("gres", "gpu:h100:8")


@pytest.mark.parametrize("res, needle", [
    ({"cpus_per_task": 13}, "resources.cpus_per_task=13 x 8 task(s) per node = 104 CPUs "
                            "exceeds partition 'gpu''s 96 per node: use cpus_per_task <= 12"),
    ({"mem_per_node_gb": 2000}, "resources.mem_per_node_gb=2000 exceeds partition 'gpu''s "
                                "1000 GB per node"),
])
def test_a_request_the_partition_cannot_meet_is_refused_before_slurm(res, needle) -> None:
    with pytest.raises(LayoutError) as err:
        requests(**res)
    assert needle in str(err.value)


@pytest.mark.parametrize("res, needle", [
    ({"cpus_per_task": 0}, "resources.cpus_per_task=0 must be a whole number 1..4096"),
    ({"cpus_per_task": True}, "resources.cpus_per_task=True must be a whole number"),
    ({"mem_per_node_gb": "8G"}, "resources.mem_per_node_gb='8G' must be a number above 0"),
    ({"mem_per_node_gb": 8, "mem_per_gpu_gb": 1}, "keep one"),
    ({"exclusive": "yes"}, "resources.exclusive='yes' must be true or false"),
    ({"cpu_per_task": 2}, "did you mean 'resources.cpus_per_task'"),
])
def test_bad_resources_name_the_value_and_the_fix(res, needle) -> None:
    with pytest.raises(SpecError) as err:
        ResourceSpec.from_dict(res)
    assert needle in str(err.value)


@pytest.mark.parametrize("option, field", [
    ("mem", "resources.mem_per_node_gb"), ("cpus-per-task", "resources.cpus_per_task"),
    ("exclusive", "resources.exclusive"), ("mem-per-gpu", "resources.mem_per_gpu_gb")])
def test_sbatch_options_the_resources_own_point_there(option, field) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({"name": "j", "partition": "debug", "run": {"command": ["x"]},
                           "sbatch": {option: "8G" if option.startswith("mem") else True}})
    assert f"use the field {field!r}" in str(err.value)
    with pytest.raises(SpecError, match="hpctrain sets --distribution itself"):
        JobSpec.from_dict({"name": "j", "partition": "debug", "run": {"command": ["x"]},
                           "sbatch": {"distribution": "cyclic"}})


@pytest.mark.parametrize("launcher, cpus", [("srun", 2), ("deepspeed", 2), ("torchrun", 4)])
def test_the_srun_that_starts_the_ranks_asks_for_the_cpus_too(launcher: str, cpus: int) -> None:
    # Slurm 22.05-23.02's srun does not inherit the batch job's --cpus-per-task
    spec = JobSpec.from_dict({"name": "j", "partition": "debug", "nodes": 2,
                              "run": {"launcher": launcher, "command": ["python3", "t.py"]}})
    script = render_script(spec)
    assert f"#SBATCH --cpus-per-task={cpus}\n#SBATCH --mem=0\n" in script
    step = next(ln for ln in script.splitlines() if ln.startswith("srun "))
    assert f" --cpus-per-task={cpus} --distribution=block " in step


def test_half_a_node_asks_for_half_its_memory(tmp_path: Path) -> None:
    spec = JobSpec.from_dict({"name": "j", "partition": "debug", "gpus_per_node": 1,
                              "run": {"launcher": "srun", "command": ["python3", "t.py"]}})
    script = render_script(spec)
    assert "#SBATCH --gpus-per-node=1\n#SBATCH --cpus-per-task=2\n#SBATCH --mem=2048M\n" in script
