"""A load from peer copies (:mod:`hpctrain.checkpoint.peers`): what a node's memory holds,
the collective restore, and the tidying after it.

One rank of each node lists the whole copies in its node's memory, whoever's they are (by
each copy's own meta); rank 0 plans (:func:`hpctrain.checkpoint.peerplan.restore_plan`) and
says the decision in the job log; the copies travel over the checkpoint's gloo group
(:meth:`Comm.exchange`); every rank decodes its copy whole (:func:`peerfile.decode`), one
collective agrees, and only then does any rank write into its state: all or nothing. A
copy that fails its checksums is set aside and the next step held whole tried.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.checkpoint import peerfile
from hpctrain.checkpoint.fit import Fit, Misfit, in_memory
from hpctrain.checkpoint.peerplan import Held, Route, restore_plan
from hpctrain.checkpoint.remap import shrunk_sources
from hpctrain.errors import CheckpointError

ATTEMPTS = 3                          # steps a load tries when copies prove damaged
REFUSED = "refused: "                 # a refusal by the caller's on_*="error", not the copy's


def say(text: str) -> None:
    """One line of the job log."""
    print(f"hpctrain: {text}", file=sys.stderr, flush=True)


# ---- node memory's files ----------------------------------------------------------------------
def listing(directory: Path) -> list[Held]:
    """Every whole copy in a node's copies ``directory``, whoever's (by its own meta): own
    buffers (``R.i.meta`` + ``R.i.data``) and ward slots (``W.a.copy``)."""
    out = []
    for path in sorted(directory.iterdir()):
        key, _, kind = path.name.rpartition(".")
        if kind not in ("meta", "copy") or not key:
            continue
        meta = peerfile.read_meta(path)
        if meta is None or path.name.split(".")[0] != str(meta.get("rank")):
            continue
        if kind == "copy":
            out.append(Held(meta["rank"], meta["step"], meta["size"], path.name))
            continue
        data = directory / f"{key}.data"
        if data.is_file() and data.stat().st_size >= meta["data_size"]:
            out.append(Held(meta["rank"], meta["step"], meta["data_size"] + meta["size"], key))
    return out


def read(directory: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The copy ``name`` (a :class:`Held`'s) in ``directory`` as (data, tail)."""
    if name.endswith(".copy"):
        blob = np.fromfile(directory / name, np.uint8)
        cut = (peerfile.meta_of(blob) or {}).get("data_size", 0)
        return blob[:cut], blob[cut:]
    end = np.fromfile(directory / f"{name}.meta", np.uint8)
    cut = (peerfile.meta_of(end) or {}).get("data_size", 0)
    return np.fromfile(directory / f"{name}.data", np.uint8, count=cut), end


def step_of(path: Path) -> int | None:
    """The step of the copy (or own buffer's tail) file ``path``; None for no whole one."""
    meta = peerfile.read_meta(path) if path.suffix in (".meta", ".copy") else None
    return None if meta is None else meta["step"]


def forget(directory: Path, rank: int, wards: Collection[int], keep: Collection[int],
           lister: bool, step: int | None) -> None:
    """After a load of ``step`` (or none): the copies of any other step go (another past;
    the training goes on from ``step``). Each rank removes its own and its wards'; a node's
    ``lister`` those of ranks neither on the node nor kept for one on it (``keep``: a
    restart may seat other ranks there). An own buffer's data stays (a staging may map it;
    its tail decides whether it holds a copy)."""
    for path in list(directory.iterdir()):
        head = path.name.split(".")[0]
        if not head.isdigit():
            continue
        whose = int(head)
        if whose in keep:
            if whose != rank and whose not in wards:
                continue             # another rank's of this node: it judges its own
            if path.suffix == ".data" or (step is not None and step_of(path) == step):
                continue
        elif not lister:
            continue
        path.unlink(missing_ok=True)


# ---- the collective restore ------------------------------------------------------------------
def restore(copies: Any, state: dict, durable: int | None, unpickle_mode: str,
            fit: Fit | None = None) -> tuple[int | None, str]:
    """Collective: the step restored into ``state`` from the copies in node memory on
    every rank (``copies``: this rank's PeerCopies), or None (``state`` untouched; the
    caller reads the durable checkpoint), and the job log's line on what of it did not fit
    ``state`` (rank 0's; '' elsewhere or when none). A damaged copy (its checksums) is set
    aside and the next step held whole tried, up to ATTEMPTS steps. The job log gets each
    decision (but for a first start: nothing held, nothing durable).

    What does not fit follows a load from storage's rules (:mod:`hpctrain.checkpoint.fit`):
    a tensor of the copy the state has no place for is left out, and a refusal (``fit``'s
    "error") on any rank is a CheckpointError on every rank, nothing written."""
    comm = copies.comm
    mine = pickle.dumps((copies.node, listing(copies.dir) if copies.lister else []))
    gathered = comm.gather_bytes(mine)
    nodes: list[str] = []
    held: dict[str, list[Held]] = {}
    for node, found in map(pickle.loads, gathered or []):
        nodes.append(node)
        held.setdefault(node, []).extend(found)
    for _ in range(ATTEMPTS):
        parts = None
        if gathered is not None:
            plan = restore_plan(nodes, held, durable, shrunk_sources(len(nodes)))
            if plan.routes[0].step is not None:
                say(f"peer copies: {plan.line}")
            elif any(held.values()) or durable is not None:
                say(f"peer copies: {plan.line}; {from_storage(durable)}")
            parts = [pickle.dumps(r) for r in plan.routes]
        route: Route = pickle.loads(comm.scatter_bytes(parts))
        if route.step is None:
            return None, ""
        decoded = _fetch(copies, route, state, unpickle_mode)
        refused = None
        if not isinstance(decoded, str):
            misfit = fitted(decoded, state, route.step, fit)
            refused = misfit.refusal()
        refusals = comm.outcomes((copies.rank, copies.node, route.source, decoded)
                                 if isinstance(decoded, str) else
                                 (copies.rank, copies.node, route.source, REFUSED + refused)
                                 if refused else None)
        if not refusals:
            peerfile.apply(decoded, state)
            return route.step, misfit.line(copies.rank if comm.active else None) \
                if copies.rank == 0 else ""
        chosen = [why for *_, why in refusals if why.startswith(REFUSED)]
        if chosen:                    # the caller's choice: not a copy to set aside
            raise CheckpointError(chosen[0][len(REFUSED):])
        damaged = all(why.startswith(peerfile.DAMAGED) for *_, why in refusals)
        if copies.rank == 0:
            said = "; ".join(f"rank {r} ({n}, its copy on {src[0]}): {why}"
                             for r, n, src, why in refusals[:3])
            more = f" and {len(refusals) - 3} more" if len(refusals) > 3 else ""
            say(f"peer copies: not restoring step {route.step}, nothing written: "
                f"{said}{more}; " + ("the next step held whole is tried" if damaged
                                     else from_storage(durable)))
        if not damaged:
            return None, ""
        for rank, _, (node, name), _ in refusals:
            held[node] = [c for c in held.get(node, []) if c.name != name
                          or c.rank != rank or c.step != route.step]
    return None, ""


def fitted(decoded: peerfile.Decoded, state: dict, step: int, fit: Fit | None) -> Misfit:
    """What of a decoded copy does not fit ``state`` (:func:`hpctrain.checkpoint.fit.
    in_memory`); the tensors the state has no place for are taken out of ``decoded``
    (not restored, as a load from storage leaves them). Nothing is written."""
    tensors = [c.path for c, _ in decoded.into] + [p for p, _ in decoded.added]
    misfit = in_memory(step, fit, state, tensors, decoded.extras)
    if misfit.unexpected:
        out = set(misfit.unexpected)
        decoded.added = [(p, v) for p, v in decoded.added if p not in out]
    return misfit


def _fetch(copies: Any, route: Route, state: dict, unpickle_mode: str) -> Any:
    """This rank's copy for ``route`` (read here, or received; the copies this rank's node
    holds for others sent), decoded against ``state``: a Decoded, or why not."""
    sends = []
    for to, name, size in route.sends:
        try:
            blob = np.concatenate(read(copies.dir, name))
        except (OSError, ValueError):
            blob = np.zeros(0, np.uint8)
        if blob.size != size:          # gone meanwhile: the receiver's checks refuse it
            blob = np.zeros(size, np.uint8)
        sends.append((to, torch.from_numpy(blob)))
    got = copies.comm.exchange(sends, route.receive)
    if got is None:
        try:
            data, end = read(copies.dir, route.local or "")
        except (OSError, ValueError) as exc:
            return f"not a whole copy (could not read it: {exc})"
    else:
        blob = got.numpy()
        cut = (peerfile.meta_of(blob) or {}).get("data_size", 0)
        data, end = blob[:cut], blob[cut:]
    return peerfile.decode(data, end, state, unpickle_mode)


def from_storage(durable: int | None) -> str:
    return "loading the durable checkpoint " + (
        f"({durable})" if durable is not None else "(none yet: the state as built)")
