"""Spare nodes (``[elastic] spare_nodes``) and shrinking (``[elastic] min_nodes``): which of
the allocation's nodes the training step runs on, how many, and how a lost one is told from
its ranks' silence. Pure; the supervisor asks Slurm
and acts (:mod:`hpctrain.supervisor.run`).

Seen on the devcluster (Slurm 22.05, SlurmdTimeout=10): a node killed under a running step
is "not responding" after about 16 s and DOWN after about 29 s, when Slurm ends the run
NODE_FAIL. The step's ranks report their heartbeat every 2 s, so a node whose every rank
went silent is found in seconds instead, and taken from the job (``scontrol update
NodeList``) before Slurm marks it DOWN: the job then runs on. A new step on the other nodes
and a spare starts at once with ``srun --overlap``: without it, it waits ("Requested nodes
are busy") for the old step, which lingers until Slurm marks the lost node DOWN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hpctrain.protocol.progress import Progress

SILENT_BEATS = 3        # a rank missing this many heartbeats in a row is silent...
SILENT_MIN_S = 6.0      # ...and for at least this long
# ...or, when a rank elsewhere already said it lost its peer (its connection closed: the
# node's processes are gone), this many beats and at least this long
CORROBORATED_BEATS, CORROBORATED_MIN_S = 2, 4.0


def step_nodes(allocation: Sequence[str], bad: Sequence[str], batch_node: str,
               widths: Sequence[int]) -> list[str] | None:
    """The nodes the step runs on: as many as the first of ``widths`` (the full width,
    then the ones it may shrink to, [elastic] min_nodes) the good nodes allow, the
    allocation's in its order without the bad ones, the batch node first (it hosts the
    rendezvous and the supervisor); None when too few are left for the smallest (no spare
    left and no shrink: the job must be requeued) or the batch node is bad. Good nodes
    beyond the width are held, as spares are."""
    if batch_node and batch_node in set(bad):
        return None                   # no step without it (the rendezvous is there)
    good = [n for n in allocation if n not in set(bad)]
    if batch_node in good:
        good.remove(batch_node)
        good.insert(0, batch_node)
    fits = next((w for w in widths if len(good) >= w), None)
    return good[:fits] if fits is not None else None


TORCHRUN = ("torchrun", "torch.distributed.run")     # the agent whose --nnodes= is the step's


def resized(argv: Sequence[str], nodes: int, full: int) -> list[str] | None:
    """The launcher's argv for a step shrunk from ``full`` nodes to ``nodes``: srun's
    ``--nodes=`` and ``--ntasks=`` (the tasks per node kept) and torchrun's ``--nnodes=``
    rewritten; as it is at full width; None when the argv does not say them in the form
    hpctrain renders (a site's own template): a shrink would start the wrong world."""
    args = list(argv)
    if nodes == full:
        return args
    if "srun" not in args:
        return None
    at = args.index("srun")
    agent = next((i for i, w in enumerate(args) if w in TORCHRUN or w.endswith("/torchrun")),
                 None)
    seen = set()
    for i, word in enumerate(args):
        name, eq, value = word.partition("=")
        if i > at and name in ("--nodes", "--ntasks") and name not in seen:
            if not value.isdigit() or int(value) % full:
                return None
            seen.add(name)
            args[i] = f"{name}={int(value) // full * nodes}"
        elif agent is not None and i > agent and name == "--nnodes" and name not in seen:
            if not eq or value != str(full):   # "--nnodes 2", an elastic "1:2": not ours
                return None
            seen.add(name)                  # torchrun's (a script's own after it: kept)
            args[i] = f"--nnodes={nodes}"
    if agent is not None and "--nnodes" not in seen:
        return None
    return args if {"--nodes", "--ntasks"} <= seen else None


def with_nodes(argv: Sequence[str], nodes: Sequence[str]) -> list[str]:
    """The launcher's argv with the step placed on ``nodes``: ``--nodelist`` and
    ``--overlap`` (a step that lost a node lingers until Slurm marks it DOWN, holding its
    CPUs) after the first ``srun``."""
    args = list(argv)
    at = args.index("srun") + 1 if "srun" in args else None
    if at is None:
        return args
    return args[:at] + [f"--nodelist={','.join(nodes)}", "--overlap"] + args[at:]


def silent_nodes(records: Mapping[int, Progress], nodes: Sequence[str], now: float,
                 beat_s: float) -> tuple[str, ...]:
    """The step's nodes every one of whose ranks went silent: no heartbeat for
    SILENT_BEATS beats (at least SILENT_MIN_S; CORROBORATED_BEATS when a rank elsewhere
    said it lost its peer) and no last word (exiting, exited, waiting to restart), while
    some rank elsewhere still beats or has left its word. A node without any record is not
    judged (its ranks may not have started)."""
    by_node: dict[str, list[Progress]] = {}
    for rec in records.values():
        if rec.node in nodes:
            by_node.setdefault(rec.node, []).append(rec)
    if any(rec.failed == "peer" for rec in records.values()):
        quiet = max(CORROBORATED_BEATS * beat_s, CORROBORATED_MIN_S)
    else:
        quiet = max(SILENT_BEATS * beat_s, SILENT_MIN_S)

    def silent(rec: Progress) -> bool:
        return not rec.final and now - rec.beat_at > quiet

    lost = tuple(n for n, recs in by_node.items() if all(map(silent, recs)))
    heard = any(not silent(r) for n, recs in by_node.items() if n not in lost for r in recs)
    return lost if heard else ()


SHOWN_NODES = 6   # nodes named one by one in :func:`last_heard`; the rest counted


def last_heard(records: Mapping[int, Progress], nodes: Sequence[str], now: float) -> str:
    """What the step's ranks last said, by node, the quietest first (at most SHOWN_NODES
    named): for a failed step that no lost node explains, what the supervisor knew when
    it ended, such as a node's ranks heard too recently to be taken for lost. E.g.
    ``n3: 2 rank(s) training, the newest beat 13.2 s ago; n1: 2 rank(s) exited/exiting,
    the newest beat 0.4 s ago``."""
    by_node: dict[str, list[Progress]] = {}
    for rec in records.values():
        if rec.node in nodes:
            by_node.setdefault(rec.node, []).append(rec)

    def age(recs: list[Progress]) -> float:
        return now - max(r.beat_at for r in recs)

    quietest = sorted(by_node.items(), key=lambda kv: -age(kv[1]))
    parts = [f"{node}: {len(recs)} rank(s) {'/'.join(sorted({r.phase for r in recs}))}, "
             f"the newest beat {age(recs):.1f} s ago" for node, recs in quietest]
    if unheard := [n for n in nodes if n not in by_node]:
        parts.insert(0, f"{','.join(unheard)}: never heard")
    if len(parts) > SHOWN_NODES:
        parts = parts[:SHOWN_NODES] + [f"{len(parts) - SHOWN_NODES} more node(s)"]
    return "; ".join(parts) or "no rank heard"
