"""A minimal in-job loop for the runtime tests (run under torchrun or plain python).

Prints one JSON line per rank at start (where am I) and at stop (which step, why).
Arguments: steps, seconds per step, and optionally a checkpoint dir: then the stop saves
asynchronously (~40 MB shared by the ranks plus a small tensor of each rank's own, still
in flight) just before exit_for_requeue.
"""

from __future__ import annotations

import json
import sys
import time

import hpctrain.runtime


def main() -> None:
    steps, sleep = int(sys.argv[1]), float(sys.argv[2])
    ckpt = sys.argv[3] if len(sys.argv) > 3 else None
    ctx = hpctrain.runtime.init()
    coord = ctx.mesh.get_coordinate()
    print(json.dumps({"event": "start", "rank": ctx.rank, "world": ctx.world_size,
                      "coords": [ctx.pp_rank, ctx.dp_rank, ctx.tp_rank], "mesh": coord,
                      "sizes": [ctx.pp_size, ctx.dp_size, ctx.tp_size],
                      "group_sizes": [ctx.group(d).size() for d in ("pp", "dp", "tp")],
                      "restart": ctx.restart_count, "last": ctx.last_exit_cause,
                      "job_id": ctx.job_id}), flush=True)
    for step in range(steps):
        time.sleep(sleep)
        if ctx.stop_requested():
            print(json.dumps({"event": "stop", "rank": ctx.rank, "step": step,
                              "cause": ctx.stop_cause}), flush=True)
            if ckpt:
                import torch

                from hpctrain.checkpoint import CheckpointManager
                # the same "w" on every rank (written once), each rank's own "mine"
                CheckpointManager(ckpt, async_save=True).save(
                    step, {"w": torch.full((10_000_000,), float(step)),
                           "mine": torch.full((1000,), float(ctx.rank))})
            ctx.exit_for_requeue(step)
    ctx.close()


if __name__ == "__main__":
    main()
