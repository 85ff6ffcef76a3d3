"""One process of hpctrain.runtime that leaves as ``argv[1]`` says, with an asynchronous
checkpoint save still in flight: ``return``, ``sys_exit``, ``raise``, ``requeue``
(exit_for_requeue) or ``close`` (ctx.close() twice, then return). ``argv[2]``: the
checkpoint root. The runtime's teardown must make the save durable before it destroys
the process group, whichever way the script leaves (tests/unit/test_runtime_exit.py).
"""

from __future__ import annotations

import sys

import torch

import hpctrain.runtime
from hpctrain.checkpoint import CheckpointManager

mode, root = sys.argv[1], sys.argv[2]
ctx = hpctrain.runtime.init()
ckpt = CheckpointManager(root, async_save=True)
ctx.step = 3
ckpt.save(3, {"w": torch.ones(4_000_000)})     # 16 MB, still being written as we leave
if mode == "sys_exit":
    sys.exit(0)
if mode == "raise":
    raise RuntimeError("boom after the save")
if mode == "requeue":
    ctx.exit_for_requeue(3, cause="time_limit")
if mode == "close":
    ctx.close()
    ctx.close()
