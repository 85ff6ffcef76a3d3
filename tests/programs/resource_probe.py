"""What did Slurm give this rank? Records it, then becomes the program that follows.

    python resource_probe.py OUT_DIR -- PROGRAM ARGS...

Writes OUT_DIR/resources-<RANK>.json: the CPUs Slurm counted for the rank's task
(SLURM_CPUS_PER_TASK), the CPUs the process may run on (sched_getaffinity: all of the
machine's where no task plugin binds), the memory Slurm counted (SLURM_MEM_PER_NODE /
_PER_GPU), the memory limit of the rank's cgroup where one is set, the node and the rank's
numbering; then execs PROGRAM with ARGS, so a training job is probed without a job of its own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def cgroup_memory_limit() -> int | None:
    """The memory limit (bytes) that holds this process in cgroup v1's memory controller:
    the least of its cgroup's and their parents' (Slurm sets it on the job's and the step's
    cgroups, each task's own is unlimited); None where none is set."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" not in controllers.split(","):
            continue
        root = Path("/sys/fs/cgroup/memory")
        group, limits = root / path.lstrip("/"), []
        while True:
            try:
                limits.append(int((group / "memory.limit_in_bytes").read_text()))
            except (OSError, ValueError):
                pass
            if group == root:
                break
            group = group.parent
        least = min(limits, default=1 << 62)
        return least if least < 1 << 60 else None     # "no limit" is a huge number
    return None


def main() -> None:
    out, rest = Path(sys.argv[1]), sys.argv[sys.argv.index("--") + 1:]
    rank = os.environ.get("RANK", "?")
    facts = {"rank": rank, "world": os.environ.get("WORLD_SIZE"),
             "node": os.environ.get("SLURMD_NODENAME"),
             "cpus_per_task": os.environ.get("SLURM_CPUS_PER_TASK"),
             "affinity": len(os.sched_getaffinity(0)),
             "mem_per_node": os.environ.get("SLURM_MEM_PER_NODE"),
             "mem_per_gpu": os.environ.get("SLURM_MEM_PER_GPU"),
             "cgroup_memory_limit": cgroup_memory_limit(),
             "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"resources-{rank}.json").write_text(json.dumps(facts))
    os.execv(rest[0], rest)


if __name__ == "__main__":
    main()
