"""A partition's facts in Slurm's own words: ``scontrol show partition`` and ``show node``.

At a site nobody has written a facts file for, Slurm still knows what each partition's
nodes offer. This turns its records (parsed ``key=value`` fields, see
:func:`hpctrain.slurm.parse.parse_kv_records`) into the keys of
:class:`hpctrain.spec.partitions.Partition`; a site's file goes on top, key by key. Where
nodes differ, the smallest wins (a job must fit on any node Slurm may give it), and the
description says so. Pure: no subprocess, no files.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

from hpctrain.errors import PartitionError

_GRES = re.compile(r"(?P<name>[^:,()]+)(?::(?P<type>[^:,()]+))?:(?P<count>\d+)(?:\([^)]*\))?")
_UNLIMITED = ("UNLIMITED", "INFINITE", "NONE", "")


def gpu_gres(gres: str) -> tuple[int, str]:
    """(GPUs, their GRES type or "") of a node's ``Gres=`` field, e.g. ``gpu:h100:8(S:0-1)``
    -> (8, "h100"); several types: their sum and ""; none: (0, "")."""
    count, types = 0, set()
    for m in _GRES.finditer(gres or ""):
        if m["name"] == "gpu":
            count += int(m["count"])
            types.add(m["type"] or "")
    return count, (types.pop() if len(types) == 1 else "")


def facts(partition: Mapping[str, str], nodes: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """The facts of one partition from its record and its nodes' records."""
    name = partition.get("PartitionName", "")
    if not nodes:
        raise PartitionError(f"Slurm's partition {name!r} has no nodes (Nodes="
                             f"{partition.get('Nodes', '')}): ask its sysadmins, or pick "
                             "another partition (sinfo lists them)")
    gres = [gpu_gres(n.get("Gres", "")) for n in nodes]
    cpus = [_int(n.get("CPUEfctv") or n.get("CPUTot"), 0) for n in nodes]
    mem_mb = [_int(n.get("RealMemory"), 0) - _int(n.get("MemSpecLimit"), 0) for n in nodes]
    types = {t for _, t in gres}
    gres_type = types.pop() if len(types) == 1 else ""
    out: dict[str, Any] = {
        "name": name,
        "gpus_per_node": min(g for g, _ in gres),
        "cpus_per_node": min(cpus),
        # Slurm's MB is MiB: a share of it asked for in MiB is exact (hpctrain.spec.resources)
        "mem_per_node_gb": math.floor(max(0, min(mem_mb)) / 1024 * 1000) / 1000,
        "max_time": _time(partition.get("MaxTime", "UNLIMITED")),
        **({"gres_type": gres_type, "gpu_type": gres_type} if gres_type else {}),
        "description": _description(partition, nodes, gres, cpus, mem_mb),
    }
    total = _int(partition.get("TotalNodes"), len(nodes))
    limit = partition.get("MaxNodes", "UNLIMITED")
    out["max_nodes"] = min(total, _int(limit, total)) if limit not in _UNLIMITED else total
    return out


# what Slurm cannot say, for the sysadmin to fill in: (line, why)
_TO_FILL = (
    ("gpu_mem_gb = 80", "memory per GPU, for `hpctrain plan`"),
    ("gpu_peak_tflops = 312", "dense bf16 per GPU, for plans and costs (H100 SXM: 989)"),
    ("gpu_hour_price = 2.5", "one GPU-hour, for report's and plan's cost ..."),
    ('currency = "EUR"', "... in this currency (or \"credits\")"),
    ('intra_node_link = "nvlink"', "nvlink | pcie"),
    ('inter_node_link = "infiniband"', "infiniband | ethernet"),
    ('default_account = ""', "an account every job here is charged to"),
    ("modules = []", "environment modules to load, in order"),
)


def facts_file(found: Mapping[str, Any]) -> str:
    """A starting facts file for a sysadmin: Slurm's facts, then what Slurm does not know,
    commented out, to check and fill in (``hpctrain templates init --from-slurm``)."""
    from hpctrain.spec.tomlwriter import dumps

    head = (f"# Partition facts for `{found['name']}`, from Slurm's own word (`hpctrain "
            "templates init --from-slurm`).\n# Check each value: a key here wins over Slurm's "
            "word. Leave out gpus_per_node, cpus_per_node\n# or mem_per_node_gb to have "
            "Slurm asked for the node facts at submit time instead.\n")
    fill = "".join(f"# {line:32} # {why}\n" for line, why in _TO_FILL)
    env = ("\n# [env]\n# NCCL_SOCKET_IFNAME = \"ib0\"        # the interfaces the ranks talk on\n"
           "# GLOO_SOCKET_IFNAME = \"ib0\"\n")
    return head + dumps(dict(found)) + "\n# What Slurm does not know:\n" + fill + env


def _description(partition: Mapping[str, str], nodes: Sequence[Mapping[str, str]],
                 gres: list[tuple[int, str]], cpus: list[int], mem_mb: list[int]) -> str:
    said = (f"from Slurm: {len(nodes)} node(s) {partition.get('Nodes', '')}, "
            f"PreemptMode={partition.get('PreemptMode', '?')}")
    if len(set(gres)) > 1 or len(set(cpus)) > 1 or len(set(mem_mb)) > 1:
        said += "; its nodes differ, the smallest is taken"
    return said


def _int(value: Any, default: int) -> int:
    text = str(value or "").strip()
    return int(text) if text.isdigit() else default


def _time(value: str) -> str:
    return "UNLIMITED" if value.upper() in _UNLIMITED else value
