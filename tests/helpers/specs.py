"""Job specs for the tests, built as dicts and checked by :class:`JobSpec` itself.

- :func:`spec`: a JobSpec in memory: :data:`BASE` (or the caller's base) with top-level
  keys replaced;
- :func:`spec_toml`: the TOML text of a spec given as its top-level fields (sections as
  dicts), checked through ``JobSpec.from_dict`` and written by ``JobSpec.to_toml``, so no
  test builds TOML by hand (tests of malformed or odd TOML keep their literal text);
- :func:`write_spec`: a small srun-launcher spec file, as the submission, status, sweep
  and requeue-limit tests submit it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from hpctrain.spec.model import JobSpec

BASE: dict[str, Any] = {"name": "gpt-tiny", "partition": "debug",
                        "run": {"command": ["python", "train.py"]}}


def spec(base: Mapping[str, Any] | None = None, /, **changes: Any) -> JobSpec:
    """``base`` (default :data:`BASE`) with ``changes`` on top, checked. A key given
    replaces that top-level key: a section given (``run={...}``) replaces the whole section.

    A test file whose specs share another base binds it once:
    ``spec = functools.partial(specs.spec, {**BASE, "nodes": 2})``."""
    return JobSpec.from_dict({**(BASE if base is None else base), **changes})


def spec_toml(**fields: Any) -> str:
    """TOML text for the spec with these top-level ``fields`` (sections as dicts), checked
    through JobSpec.from_dict first; JobSpec.load reads it back into the same spec. Every
    value is written out, defaults included."""
    return JobSpec.from_dict(fields).to_toml()


def write_spec(path: Path, *, name: str = "t", nodes: int = 1, gpus: int = 1,
               command: list[str] | None = None, partition: str = "debug",
               time: str = "00:05:00", checkpoint_dir: str | None = None,
               requeue: Mapping[str, Any] | None = None, **fields: Any) -> Path:
    """Write a small srun-launcher spec to ``path`` (the srun launcher starts one rank per
    GPU) and return ``path``.

    ``requeue`` adds keys to the default ``[requeue]`` (``signal_lead_s = 10``); ``fields``
    are further top-level keys and sections, e.g. ``output="/x/job-%j.out"`` or
    ``sbatch={"mem-per-cpu": "9000G"}``."""
    data: dict[str, Any] = {
        "name": name, "partition": partition, "nodes": nodes, "gpus_per_node": gpus,
        "time": time, **fields, "requeue": {"signal_lead_s": 10, **(requeue or {})},
        "run": {"launcher": "srun",
                "command": command or ["bash", "-c", "echo rank $RANK of $WORLD_SIZE"]}}
    if checkpoint_dir:
        data["checkpoint"] = {"dir": checkpoint_dir}
    path.write_text(spec_toml(**data))
    return path
