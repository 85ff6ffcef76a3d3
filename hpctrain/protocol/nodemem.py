"""Node-local memory of one run of a job: where the peer copies of snapshots live
(:mod:`hpctrain.checkpoint.peers`), and their removal when the run is over.

The copies must outlive the processes that made them (a lost node's step restarts in new
processes on the others and a spare), and not the run: each node keeps them in a
job-private directory of its own memory (``/dev/shm``, or ``$HPCTRAIN_LOCAL_DIR``, beside
the progress channel's node directory), named after the run and the node (emulated
devcluster nodes share one host). The supervisor removes them on every node once the run
ends (``python -m hpctrain.protocol.nodemem RUN_ID RESTART_COUNT``, one task per node);
a node lost with its copies takes them along, and a site's per-job ``/dev/shm`` clears
what a killed job left.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from hpctrain.protocol import channel

PEER_COPIES = "HPCTRAIN_PEER_COPIES"   # "1": snapshots are also kept in node memory and a
#                                        partner's on another node ([elastic] peer_copies)
SUFFIX = ".peer"


def peer_dir(env: Mapping[str, str], run_id: str, restart_count: int, node: str) -> Path:
    """This node's directory of peer copies for run ``run_id``/``restart_count``."""
    local = channel.node_dir(env, run_id, restart_count, node)
    return local.with_name(local.name + SUFFIX)


def remove(env: Mapping[str, str], run_id: str, restart_count: int, node: str) -> bool:
    """Remove this node's peer copies of the run; True when there were any."""
    path = peer_dir(env, run_id, restart_count, node)
    if not path.is_dir():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def remove_earlier(env: Mapping[str, str], run_id: str, restart_count: int,
                   node: str) -> list[Path]:
    """Remove this node's peer copies of the job's earlier runs (a run killed with its
    supervisor left them); the directories removed."""
    here = peer_dir(env, run_id, restart_count, node)
    gone = []
    for earlier in range(restart_count):
        path = peer_dir(env, run_id, earlier, node)
        if path != here and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


def main(argv: list[str] | None = None) -> int:
    """``python -m hpctrain.protocol.nodemem RUN_ID RESTART_COUNT``: this node's copies of
    that run removed (the node's name from Slurm's SLURMD_NODENAME)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m hpctrain.protocol.nodemem RUN_ID RESTART_COUNT",
              file=sys.stderr)
        return 2
    remove(os.environ, args[0], int(args[1]), os.environ.get("SLURMD_NODENAME", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
