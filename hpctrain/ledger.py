"""The requeue ledger: what the batch script counts each cause's requeues with.

The templates' batch script keeps one file per job on shared storage, beside the
runtime's exit record: ``<checkpoint dir, else submit dir>/.hpctrain-requeues-<job id>``
(``$HPCTRAIN_REQUEUE_FILE``). One line per requeue, and one when a limit ended the job::

    requeue cause=preemption restart_count=1 by=script
    requeue cause=node_fail restart_count=2 by=slurm
    stop cause=preemption restart_count=2 limit=max_preemptions=1

``by=script``: the script requeued the job itself (preemption, time limit). ``by=slurm``:
Slurm did (node failure, or a preemption the script did not get to requeue); the next
run enters those when it starts. Reading it is plain file reads: no Slurm call, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FILE_PREFIX = ".hpctrain-requeues-"


@dataclass(frozen=True)
class Ledger:
    """A parsed ledger: requeues by cause, and the limit that ended the job, if one did."""

    requeues: dict[str, int] = field(default_factory=dict)
    stop: dict[str, str] = field(default_factory=dict)   # the "stop" line's fields

    @property
    def total(self) -> int:
        return sum(self.requeues.values())

    @property
    def limit(self) -> str | None:
        """``max_preemptions=1`` when that limit ended the job, else None."""
        return self.stop.get("limit")


def _fields(words: list[str]) -> dict[str, str]:
    out = {}
    for word in words:
        key, sep, value = word.partition("=")   # a limit's value has its own "="
        if sep:
            out[key] = value
    return out


def parse_ledger(text: str) -> Ledger:
    """The ledger in ``text``; unknown and damaged lines are ignored."""
    requeues: dict[str, int] = {}
    stop: dict[str, str] = {}
    for line in text.splitlines():
        kind, *words = line.split() or [""]
        fields = _fields(words)
        if kind == "requeue" and fields.get("cause"):
            requeues[fields["cause"]] = requeues.get(fields["cause"], 0) + 1
        elif kind == "stop" and fields.get("limit"):
            stop = fields
    return Ledger(requeues, stop)


def requeues_by_cause(from_sacct: dict[str, int], ledger: Ledger | None) -> dict[str, int]:
    """Requeues by cause: the ledger's, which knows the cause of every requeue the batch
    script made (sacct says only REQUEUED), unless it lags behind sacct (Slurm's own
    requeues are entered by the next run): then sacct's."""
    if ledger is not None and ledger.total >= sum(from_sacct.values()):
        return ledger.requeues
    return from_sacct


def read_ledger(job_id: str, *dirs: str) -> Ledger | None:
    """The ledger of ``job_id`` from the first of ``dirs`` that has one (the batch script
    writes it to the checkpoint dir, else the submit dir); None when there is none."""
    for d in dirs:
        if not d:
            continue
        try:
            return parse_ledger((Path(d) / f"{FILE_PREFIX}{job_id}").read_text(errors="replace"))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
            continue
    return None
