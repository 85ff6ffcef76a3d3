"""What the active Slurm says about its partitions, and which cluster it is.

``scontrol show partition NAME`` and ``scontrol show node NODES`` (one line per record,
parsed by :func:`hpctrain.slurm.parse.parse_kv_records`); the cluster's name from the
slurm.conf this machine's clients read. Turning the records into facts is
:mod:`hpctrain.spec.slurmfacts`'s (pure) job.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping

from hpctrain.errors import SlurmError
from hpctrain.slurm import client
from hpctrain.slurm.parse import parse_kv_records

# ClusterName of the devcluster (`hpctrain devcluster up`): its partitions' facts files
# are used only where the active Slurm is it
DEVCLUSTER = "hpcdev"
DEFAULT_CONF = "/etc/slurm/slurm.conf"
_CLUSTER = re.compile(r"^\s*ClusterName\s*=\s*(\S+)", re.IGNORECASE | re.MULTILINE)

Record = dict[str, str]


def show_partition(name: str, *, timeout: float = 10.0) -> tuple[Record, list[Record]] | None:
    """Slurm's record of partition ``name`` and of each of its nodes; None when Slurm has
    no such partition. Raises SlurmError when Slurm cannot be asked."""
    res = client.run(["scontrol", "show", "partition", name, "-o"], timeout=timeout,
                     check=False)
    if res.returncode != 0:
        said = (res.stderr.strip() or res.stdout.strip())
        if "not found" in said:
            return None
        raise SlurmError(f"scontrol show partition {name} failed: {said or res.returncode}")
    records = parse_kv_records(res.stdout)
    if not records:
        return None
    nodes = records[0].get("Nodes", "")
    if not nodes or nodes == "(null)":
        return records[0], []
    shown = client.run(["scontrol", "show", "node", nodes, "-o"], timeout=timeout)
    return records[0], parse_kv_records(shown.stdout)


def names(*, timeout: float = 10.0) -> list[str]:
    """Every partition the active Slurm has, in its order."""
    res = client.run(["scontrol", "show", "partition", "-o"], timeout=timeout)
    return [r["PartitionName"] for r in parse_kv_records(res.stdout) if r.get("PartitionName")]


def conf_path(environ: Mapping[str, str] | None = None) -> str:
    """The slurm.conf Slurm's clients read here: $SLURM_CONF, else the default path."""
    env = os.environ if environ is None else environ
    return env.get("SLURM_CONF") or DEFAULT_CONF


def cluster_name(environ: Mapping[str, str] | None = None) -> str | None:
    """The ClusterName in this machine's slurm.conf, None when there is none to read (a
    configless site's clients ask the controller: not the devcluster, which writes one)."""
    try:
        text = Path(conf_path(environ)).read_text(errors="replace")
    except OSError:
        return None
    m = _CLUSTER.search(text)
    return m.group(1) if m else None


def is_devcluster(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the active Slurm is hpctrain's devcluster."""
    return cluster_name(environ) == DEVCLUSTER
