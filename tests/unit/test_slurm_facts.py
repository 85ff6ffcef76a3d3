"""A partition's facts from Slurm's own records (hpctrain.spec.slurmfacts), and a site's file
laid over them key by key (hpctrain.spec.partitions.find_partition)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hpctrain.errors import PartitionError
from hpctrain.slurm.parse import parse_kv_records
from hpctrain.spec import slurmfacts
from hpctrain.spec.partitions import find_partition, needs_slurm

# `scontrol show partition gpu -o` and `scontrol show node n[1-2] -o` as a site with two
# H100 nodes answers them (Slurm 22.05's fields; the devcluster's lines, reshaped)
PARTITION = ("PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL Default=NO GraceTime=0 "
             "MaxNodes=UNLIMITED MaxTime=2-00:00:00 MinNodes=0 Nodes=g[01-02] PreemptMode=OFF "
             "State=UP TotalCPUs=192 TotalNodes=2 DefMemPerNode=UNLIMITED")
NODE = ("NodeName={name} Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUEfctv={cpus} CPUTot=96 "
        "Gres={gres} NodeAddr={name} RealMemory={mem} AllocMem=0 Sockets=2 State=IDLE "
        "Partitions=gpu")


def word(*nodes: dict[str, object], partition: str = PARTITION):
    part = parse_kv_records(partition)[0]
    return part, [parse_kv_records(NODE.format(**n))[0] for n in nodes]


H100 = {"name": "g01", "cpus": 96, "gres": "gpu:h100:8(S:0-1)", "mem": 1031000}


def test_the_node_facts_come_from_slurm() -> None:
    got = slurmfacts.facts(*word(H100, {**H100, "name": "g02"}))
    assert {k: got[k] for k in ("name", "gpus_per_node", "gres_type", "cpus_per_node",
                                "max_time", "max_nodes")} == {
        "name": "gpu", "gpus_per_node": 8, "gres_type": "h100", "cpus_per_node": 96,
        "max_time": "2-00:00:00", "max_nodes": 2}
    # Slurm's MB are MiB; kept so that a share of them is exact, rounded down
    assert got["mem_per_node_gb"] == 1006.835 and got["mem_per_node_gb"] * 1024 <= 1031000
    assert got["description"] == "from Slurm: 2 node(s) g[01-02], PreemptMode=OFF"


def test_where_nodes_differ_the_smallest_is_taken_and_said() -> None:
    small = {"name": "g02", "cpus": 64, "gres": "gpu:h100:4", "mem": 515000}
    got = slurmfacts.facts(*word(H100, small))
    assert (got["gpus_per_node"], got["cpus_per_node"]) == (4, 64)
    assert "its nodes differ, the smallest is taken" in got["description"]
    mixed = slurmfacts.facts(*word(H100, {**H100, "name": "g02", "gres": "gpu:a100:8"}))
    assert "gres_type" not in mixed        # two types: an untyped request fits both


@pytest.mark.parametrize("gres, want", [
    ("gpu:2", (2, "")), ("gpu:h100:8(S:0-1)", (8, "h100")), ("(null)", (0, "")),
    ("gpu:a100:4,gpu:a100:4(S:1)", (8, "a100")), ("nic:2,gpu:v100:4", (4, "v100")),
    ("gpu:a100:4,gpu:v100:4", (8, "")), ("", (0, "")),
])
def test_gpu_gres(gres: str, want: tuple[int, str]) -> None:
    assert slurmfacts.gpu_gres(gres) == want


def test_max_nodes_is_the_partitions_limit_or_its_size() -> None:
    limited = PARTITION.replace("MaxNodes=UNLIMITED", "MaxNodes=1")
    assert slurmfacts.facts(*word(H100, partition=limited))["max_nodes"] == 1
    forever = PARTITION.replace("MaxTime=2-00:00:00", "MaxTime=UNLIMITED")
    assert slurmfacts.facts(*word(H100, partition=forever))["max_time"] == "UNLIMITED"


def test_a_partition_without_nodes_is_refused_by_name() -> None:
    with pytest.raises(PartitionError, match="Slurm's partition 'gpu' has no nodes"):
        slurmfacts.facts(*word())


def test_a_site_file_refines_slurms_facts_key_by_key(tmp_path: Path) -> None:
    facts = slurmfacts.facts(*word(H100))
    (tmp_path / "partitions").mkdir()
    site = tmp_path / "partitions" / "gpu.toml"
    site.write_text('name = "gpu"\ngpu_peak_tflops = 989\ncpus_per_node = 88\n'
                    '[env]\nNCCL_SOCKET_IFNAME = "ib0"\n')
    assert needs_slurm("gpu", [tmp_path])            # it leaves out GPUs and memory
    part = find_partition("gpu", [tmp_path], slurm=facts)
    assert (part.gpus_per_node, part.cpus_per_node, part.gpu_peak_tflops) == (8, 88, 989)
    assert part.env == {"NCCL_SOCKET_IFNAME": "ib0"} and part.gres_type == "h100"
    assert part.source == f"{site}, over Slurm's facts"
    with pytest.raises(PartitionError, match="missing required key 'gpus_per_node'"):
        find_partition("gpu", [tmp_path])            # no Slurm to ask: the file is not enough
    alone = find_partition("gpu", [], slurm=facts)   # no file at all
    assert alone.source == "Slurm (partition gpu)" and alone.max_time == "2-00:00:00"


def test_the_starting_file_reads_back_into_the_same_facts(tmp_path: Path) -> None:
    facts = slurmfacts.facts(*word(H100))
    text = slurmfacts.facts_file(facts)
    assert tomllib.loads(text) == facts
    assert "# gpu_peak_tflops = 312" in text and "# NCCL_SOCKET_IFNAME" in text
    (tmp_path / "partitions").mkdir()
    (tmp_path / "partitions" / "gpu.toml").write_text(text)
    assert not needs_slurm("gpu", [tmp_path])
    assert find_partition("gpu", [tmp_path]).gpus_per_node == 8
