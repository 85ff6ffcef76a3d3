"""Whose saved state each rank loads when the data-parallel width changed: a step the
supervisor shrank without a spare ([elastic] min_nodes), and the next start that grows it
back. The replicas of a tp x dp x pp layout hold the same model and optimizer, so a rank
takes the state of the saved rank with its pipeline stage and tensor slice, of the replica
with its data-parallel index (modulo the saved width when it grew). A durable step records
the layout it was saved at (its manifest's ``layout``: ``tp``, ``dp``, ``pp``); a peer copy
in node memory does not, and is read as the full width's (``HPCTRAIN_FULL_DP``). In the
job: reads the step's environment, imports no submission code.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hpctrain import protocol
from hpctrain.errors import LayoutError
from hpctrain.mesh import coords_to_rank, rank_to_coords, source_rank


def mesh_of(world: int, env: Mapping[str, str] | None = None) -> dict[str, int]:
    """The step's layout as the rendered script says it ({} when it says none, or one
    that does not make ``world``): what a save records beside its ranks."""
    env = os.environ if env is None else env
    try:
        tp, pp = int(env.get(protocol.TP) or 1), int(env.get(protocol.PP) or 1)
        dp = int(env.get(protocol.DP) or 0) or world // max(tp * pp, 1)
    except ValueError:
        return {}
    if tp * dp * pp != world or world < 1:
        return {}
    shape = shrunk_shape(world, env)      # saved while shrunk: the width it came from
    return {"tp": tp, "dp": dp, "pp": pp, **({"full_dp": shape[3]} if shape else {})}


def saved_rank(rank: int, world: int, saved: Mapping[str, Any], saved_world: int,
               env: Mapping[str, str] | None = None) -> int:
    """The rank of a durable step (saved by ``saved_world`` ranks at layout ``saved``,
    its manifest's) whose part ``rank`` of this step loads: its own, unless the
    supervisor changed the data-parallel width (this step is shrunk, or it grows back to
    the width the step was saved shrunk from) with the same tp and pp. A world the user
    changed keeps its own rank (a per-rank value the step lacks is refused, not copied
    from another replica: its RNG state would repeat another's)."""
    mine = mesh_of(world, env)
    if not mine.get("full_dp") and saved.get("full_dp") != mine.get("dp"):
        return rank
    try:
        tp, dp, pp = (int(saved[k]) for k in ("tp", "dp", "pp"))
    except (KeyError, TypeError, ValueError):        # a step saved before layouts were
        sources = shrunk_sources(world, env)         # recorded: the full width's, if so
        return sources[rank] if sources is not None and saved_world == full_world(world, env) \
            else rank
    if not mine or (mine["tp"], mine["pp"]) != (tp, pp) or mine["dp"] == dp or \
            tp * dp * pp != saved_world:
        return rank
    try:
        c = rank_to_coords(rank, mine["tp"], mine["dp"], mine["pp"])
        return coords_to_rank(c.pp, c.dp % dp, c.tp, tp, dp, pp)
    except LayoutError:
        return rank


def shrunk_sources(world: int, env: Mapping[str, str] | None = None) -> list[int] | None:
    """A step the supervisor shrank (``HPCTRAIN_FULL_DP`` beside the step's layout): the
    full-width rank each rank takes its state from; None at full width."""
    shape = shrunk_shape(world, env)
    if shape is None:
        return None
    tp, dp, pp, full = shape
    return [source_rank(r, tp, dp, pp, full) for r in range(world)]


def full_world(world: int, env: Mapping[str, str] | None = None) -> int:
    """The job's full world size: ``world`` unless the step was shrunk."""
    shape = shrunk_shape(world, env)
    return world if shape is None else world // shape[1] * shape[3]


def shrunk_shape(world: int, env: Mapping[str, str] | None = None
                 ) -> tuple[int, int, int, int] | None:
    """(tp, dp, pp, full dp) of a shrunk step of ``world`` ranks; None at full width."""
    env = os.environ if env is None else env
    try:
        full = int(env.get(protocol.FULL_DP) or 0)
        tp, pp = int(env.get(protocol.TP) or 1), int(env.get(protocol.PP) or 1)
    except ValueError:
        return None              # the runtime's environment refused these at start
    dp = world // (tp * pp) if tp > 0 and pp > 0 and world % (tp * pp) == 0 else 0
    if not full or not dp or full <= dp or full % dp:
        return None
    return tp, dp, pp, full
