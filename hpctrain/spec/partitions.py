"""Partition facts: what Slurm says of a partition, refined by the site's own file.

Slurm knows a partition's nodes (CPUs, memory, GPUs and their GRES type) and limits (max
time, max nodes): :mod:`hpctrain.spec.slurmfacts` turns its word into facts. A site's file,
``templates/partitions/<name>.toml``, adds what Slurm does not know or overrides it, key by
key: site defaults (account, QoS, constraint), the environment to load (modules, NCCL and
network variables), containers, a node health check, and the planner's figures (peak TFLOPS
per GPU, GPU memory, interconnects). A complete file needs no word from Slurm. Loading is
pure apart from reading files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from hpctrain.errors import PartitionError
from hpctrain.protocol import defaults
from hpctrain.spec.container import ContainerFacts
from hpctrain.spec.source import read_toml


@dataclass(frozen=True)
class Partition:
    """What one SLURM partition offers, as its sysadmins describe it."""

    name: str
    gpus_per_node: int
    cpus_per_node: int
    mem_per_node_gb: float
    max_time: str = "UNLIMITED"
    max_nodes: int | None = None
    gpu_type: str = "gpu"                # what the GPUs are, in words (plans, reports)
    gres_type: str = ""                  # Slurm's GRES type ("h100": --gpus-per-node=h100:8)
    gpu_mem_gb: float = 80.0
    gpu_peak_tflops: float = 312.0       # dense bf16 per GPU, for cost estimates and MFU
    gpu_hour_price: float | None = None  # what one GPU-hour costs here (report, plan) ...
    currency: str = ""                   # ... in this currency ("EUR", "USD", "credits")
    gpu_emulated: bool = False           # the GPUs are stand-ins (the devcluster): CPU figures
    intra_node_link: str = "nvlink"      # nvlink | pcie
    inter_node_link: str = "infiniband"  # infiniband | ethernet
    description: str = ""
    default_account: str = ""
    default_qos: str = ""
    default_constraint: str = ""
    modules: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    # planner: overrides of the default scaling-efficiency curve, e.g. {"inter_node": 0.9}
    scaling: dict[str, float] = field(default_factory=dict)
    # how rendered scripts ask for GPUs: "gpus-per-node" (--gpus-per-node=N) or "gres" (--gres=gpu:N)
    gpu_request: str = "gpus-per-node"
    # a site's node check (argv, no shell) the job supervisor runs once per node before
    # the training step: a node where it fails is left out and the job requeued for free
    health_check: tuple[str, ...] = ()
    health_check_timeout_s: int = defaults.HEALTH_CHECK_TIMEOUT_S
    # how this site runs containers ([container]: runtime, allowed images, mounts, required)
    container: ContainerFacts | None = None
    source: str = ""                     # the file it was read from

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> "Partition":
        known = {f.name for f in fields(cls)} - {"source"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PartitionError(f"{source}: unknown key(s) {', '.join(unknown)}; "
                                 f"valid keys: {', '.join(sorted(known))}")
        for key in ("name", *REQUIRED):
            if key not in data:
                raise PartitionError(f"{source}: missing required key {key!r}: give it, or "
                                     "let hpctrain ask Slurm (a partition Slurm knows, where "
                                     "scontrol answers)")
        values = dict(data)
        values["modules"] = tuple(values.get("modules", ()))
        check = values.get("health_check", ())
        if not isinstance(check, (list, tuple)) or not all(
                isinstance(w, str) and w for w in check):
            raise PartitionError(f"{source}: health_check={check!r} must be a command as a list "
                                 'of words, e.g. ["/opt/site/gpu-check", "--quick"]')
        values["health_check"] = tuple(check)
        values["env"] = {str(k): str(v) for k, v in values.get("env", {}).items()}
        if "container" in values:
            values["container"] = ContainerFacts.from_dict(values["container"], source)
        try:
            part = cls(**values, source=source)
        except TypeError as exc:  # pragma: no cover - guarded by the key checks
            raise PartitionError(f"{source}: {exc}") from None
        for key in ("gpus_per_node", "cpus_per_node", "health_check_timeout_s"):
            value = getattr(part, key)
            if not isinstance(value, int) or value < 0:
                raise PartitionError(f"{source}: {key}={value!r} must be a whole number >= 0")
        check_price(part)
        return part


def check_price(part: Partition) -> None:
    """A GPU-hour's price is a number >= 0 with its currency, or not given at all; whether
    the GPUs are emulated is true or false."""
    price, where = part.gpu_hour_price, part.source
    if not isinstance(part.gpu_emulated, bool):
        raise PartitionError(f"{where}: gpu_emulated={part.gpu_emulated!r} must be true or "
                             "false")
    if price is None:
        if part.currency:
            raise PartitionError(f"{where}: currency={part.currency!r} without gpu_hour_price: "
                                 "give the price of one GPU-hour too, e.g. gpu_hour_price = 2.5")
        return
    if isinstance(price, bool) or not isinstance(price, (int, float)) or not price >= 0:
        raise PartitionError(f"{where}: gpu_hour_price={price!r} must be a number >= 0 (the "
                             "price of one GPU-hour, e.g. 2.5)")
    if not isinstance(part.currency, str) or not part.currency.strip():
        raise PartitionError(f"{where}: gpu_hour_price={price} needs its currency: add "
                             'currency = "EUR" (or "USD", "credits", ...)')


def _partition_files(dirs: Iterable[Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in reversed(list(dirs)):  # lowest priority first, so higher ones overwrite
        pdir = d / "partitions"
        if pdir.is_dir():
            for f in sorted(pdir.glob("*.toml")):
                found[f.stem] = f
    return found


def read_partition_file(path: Path) -> Partition:
    """Parse one partition facts file."""
    data = read_toml(path, PartitionError, "partition facts")
    part = Partition.from_dict(data, source=str(path))
    if part.name != path.stem:
        raise PartitionError(f"{path}: name={part.name!r} must match the file name {path.stem!r}")
    return part


REQUIRED = ("gpus_per_node", "cpus_per_node", "mem_per_node_gb")


def find_partition(name: str, dirs: Iterable[Path],
                   slurm: Mapping[str, Any] | None = None) -> Partition:
    """The facts of partition ``name`` on the search path ``dirs`` (no environment read).

    ``slurm``: Slurm's facts of the partition (:func:`hpctrain.spec.slurmfacts.facts`), under
    its file's keys when it has one; None: the file alone, which must then be complete."""
    files = _partition_files(dirs)
    if name not in files and slurm is None:
        known = ", ".join(sorted(files)) or "none"
        raise PartitionError(f"unknown partition {name!r}: known partitions are {known} "
                             "(add templates/partitions/<name>.toml to define it)")
    if name not in files:
        return Partition.from_dict(dict(slurm or {}), source=f"Slurm (partition {name})")
    if slurm is None:
        return read_partition_file(files[name])
    path = files[name]
    data = read_toml(path, PartitionError, "partition facts")
    part = Partition.from_dict({**slurm, **data}, source=f"{path}, over Slurm's facts")
    if part.name != path.stem:
        raise PartitionError(f"{path}: name={part.name!r} must match the file name {path.stem!r}")
    return part


def needs_slurm(name: str, dirs: Iterable[Path]) -> bool:
    """Whether the facts of ``name`` need Slurm's word: no file names it, or its file
    leaves out a node fact (GPUs, CPUs or memory per node)."""
    path = _partition_files(dirs).get(name)
    if path is None:
        return True
    data = read_toml(path, PartitionError, "partition facts")
    return any(key not in data for key in REQUIRED)


def partition_names(dirs: Iterable[Path]) -> list[str]:
    """The partitions a facts file names on an explicit search path, complete or not."""
    return sorted(_partition_files(dirs))


def partitions_in(dirs: Iterable[Path]) -> list[Partition]:
    """Every partition on an explicit search path, by name (no environment read)."""
    files = _partition_files(dirs)
    return [read_partition_file(files[n]) for n in sorted(files)]
