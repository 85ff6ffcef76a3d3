"""One rank of tests/unit/test_ckpt_peers.py's four (no scheduler: the test starts each as
its own process, as srun does, ``$SLURMD_NODENAME`` saying its node).

``train``: steps 1-7 of a tiny loop, a snapshot after each (peer copies on: each rank's
in its node's memory and its partner's), a durable save at step 4; it waits until its
wards' copies of step 7 are in its node's memory. ``resume``: new processes load the newest
step (``load_latest``). Each writes its step, its replicated weights and its own per-rank
tensor (as hex: bitwise comparisons) to OUT as JSON.

    peer_copy_worker.py train|resume CKPT_DIR OUT
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from hpctrain.checkpoint import CheckpointManager, peerload

STEPS, DURABLE = 7, 4


def main() -> None:
    phase, root, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state = {"w": torch.zeros(1000), "rng": torch.zeros(4), "step": 0}
    mgr = CheckpointManager(root, keep_last=2)
    step = 0
    if phase == "train":
        gen = torch.Generator().manual_seed(0)
        for step in range(1, STEPS + 1):
            state["w"] += torch.randn(1000, generator=gen)     # the same on every rank
            state["rng"] = torch.full((4,), float(rank * 100 + step))   # its own
            state["step"] = step
            if step == DURABLE:
                mgr.save(step, state)
            mgr.snapshot(step, state)
        peers = mgr._memory.peers
        assert peers is not None, "peer copies are off"
        mgr.close()
        end = time.monotonic() + 30
        while not {(w, STEPS) for w in peers.wards} <= {(h.rank, h.step)
                                                        for h in peerload.listing(peers.dir)}:
            assert time.monotonic() < end, f"rank {rank}: its wards' copies never came"
            time.sleep(0.05)
    else:
        step = mgr.load_latest(state)
        mgr.close()
    dist.barrier()
    with open(out, "w") as fh:
        json.dump({"step": step, "w": state["w"].numpy().tobytes().hex(),
                   "rng": state["rng"].numpy().tobytes().hex(), "pid": os.getpid()}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
