"""Where does this rank run? Records what it sees, then becomes the program that follows.

    python container_probe.py OUT_DIR -- PROGRAM ARGS...

Writes OUT_DIR/probe-<RANK>-<restart>.json (Slurm's container variable, the root
file system's mount, what /mnt/data holds and whether it can be written, the working
directory, the node and the rank's numbering) and then execs PROGRAM with ARGS, so a
training job is probed from inside its container without a job of its own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def root_mount() -> str:
    """The source of the mount at / as this process sees it (/proc/self/mountinfo)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return fields[3]   # the root of the mount within its file system
    return ""


def main() -> None:
    out, rest = Path(sys.argv[1]), sys.argv[sys.argv.index("--") + 1:]
    data = Path("/mnt/data")
    try:
        (data / "written-inside").write_text("x")
        writable = True
    except OSError:
        writable = False
    rank = os.environ.get("RANK", "?")
    facts = {"rank": rank, "local_rank": os.environ.get("LOCAL_RANK"),
             "world": os.environ.get("WORLD_SIZE"), "node": os.environ.get("SLURMD_NODENAME"),
             "slurm_container": os.environ.get("SLURM_CONTAINER"), "root": root_mount(),
             "data": sorted(os.listdir(data)) if data.is_dir() else None,
             "hello": (data / "hello").read_text() if (data / "hello").is_file() else None,
             "data_writable": writable, "cwd": os.getcwd(),
             "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}
    from hpctrain.runtime.environment import Environment   # mounted in from the host

    facts["runtime_node"] = Environment.from_env().node
    out.mkdir(parents=True, exist_ok=True)
    (out / f"probe-{rank}-{facts['restart']}.json").write_text(json.dumps(facts))
    os.execv(rest[0], rest)


if __name__ == "__main__":
    main()
