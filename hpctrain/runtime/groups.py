"""A process group's end: destroyed, collected, and its connections closed for its peers.

Why this matters: a rank whose attempt failed tears its process group down so that the
peers waiting for it in a collective fail there at once (gloo: "Connection closed by
peer") and can start the next attempt (:mod:`hpctrain.runtime.restart`). A gloo group's
connections close only when the group object is freed, and neither ``abort()`` nor
``shutdown()`` closes them (torch 2.13, measured). Anything that still refers to the group
after ``destroy_process_group()`` keeps the peers waiting until their collective timeout.

The one such reference found (2026-11-26, the plainest DP loop, ``all_reduce`` on the
default group): ``torch.distributed.nn.functional`` binds ``group=group.WORLD`` as a default
argument of ten functions when it is imported, and torch imports it lazily, on the first
DeviceMesh or DTensor use, after the first group exists. The default group of the first
attempt then lived for the whole process: the surviving ranks waited in a gloo all-reduce
for a rank that had long left. :func:`preload` imports it before any group exists (its
defaults are then ``None``: "the default group", as intended); :func:`destroy` checks that
every destroyed group was freed, releases one still held by a function's default
arguments (a library imported later does the same), and says so when something else
holds one.
"""

from __future__ import annotations

import gc
import sys
import types
import weakref
from typing import Any

# modules that evaluate ``group.WORLD`` at import (as a default argument)
CAPTURES_WORLD_AT_IMPORT = ("torch.distributed.nn.functional",)


def preload() -> None:
    """Import the modules that would capture the first process group at import, while no
    group exists (call before ``init_process_group``). Never raises."""
    import importlib

    for name in CAPTURES_WORLD_AT_IMPORT:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001,S110 - a torch without it: nothing to capture
            pass


def destroy(rank: int, check: bool = False) -> list[str]:
    """``torch.distributed.destroy_process_group()`` and a garbage collection (see
    :mod:`hpctrain.runtime.teardown`). With ``check`` (an attempt ends, the process goes
    on), every group it destroyed must be gone: one held by a function's default arguments
    is released from them; what still holds one is printed and returned (empty when all
    were freed). Never raises."""
    alive: list[weakref.ref] = []
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        if dist.is_initialized() and check:
            # (a group of one rank has no connections to keep open)
            alive = [weakref.ref(g) for g in list(distributed_c10d._world.pg_map)
                     if g.size() > 1]
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - a peer already gone: nothing to undo
        print(f"hpctrain: rank {rank}: destroy_process_group: {exc}", file=sys.stderr,
              flush=True)
    gc.collect()
    held = []
    for ref in alive:
        group = ref()
        if group is None:
            continue
        released = release_defaults(group)
        del group
        gc.collect()
        if ref() is not None:
            held.append(holders(ref()))
        elif released:
            print(f"hpctrain: rank {rank}: released a destroyed process group from the "
                  f"default arguments of {', '.join(released)}", file=sys.stderr, flush=True)
    for text in held:
        print(f"hpctrain: rank {rank}: a destroyed process group is still referenced "
              f"({text}): its connections stay open, and a peer waiting in it leaves only "
              "at its collective timeout", file=sys.stderr, flush=True)
    return held


def release_defaults(group: Any) -> list[str]:
    """Replace ``group`` by None in the default arguments of every function holding it
    (None: the default group, whatever it is then); the functions' names. Every function
    is looked at: a defaults tuple of untracked objects is itself untracked by the garbage
    collector, so ``gc.get_referrers`` would not find it."""
    names = []
    for fn in gc.get_objects():
        if type(fn) is not types.FunctionType:   # (isinstance: a deprecated object warns)
            continue
        if fn.__defaults__ and any(v is group for v in fn.__defaults__):
            fn.__defaults__ = tuple(None if v is group else v for v in fn.__defaults__)
        elif fn.__kwdefaults__ and any(v is group for v in fn.__kwdefaults__.values()):
            fn.__kwdefaults__ = {k: None if v is group else v
                                 for k, v in fn.__kwdefaults__.items()}
        else:
            continue
        names.append(f"{fn.__module__}.{fn.__qualname__}")
    return names


def holders(group: Any) -> str:
    """What refers to ``group`` (object types, for the log line)."""
    kinds = sorted({type(h).__name__ for h in gc.get_referrers(group)})
    return f"{sys.getrefcount(group) - 2} reference(s); held by " + \
        (", ".join(kinds) if kinds else "objects the garbage collector does not see")
