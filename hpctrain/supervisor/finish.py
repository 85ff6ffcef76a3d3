"""Did the ranks finish their work before the step failed? Read from their own last word.

A rank that dies *after* its script's work ended (torch's gloo group aborting in the
interpreter's C++ destructors, a library's atexit handler crashing, a teardown that never
returns) has not failed the job: every step ran and every save is durable. The runtime's
teardown (:mod:`hpctrain.runtime.teardown`) says so in each rank's progress record before
it tears the process group down (``exit=return``, then phase ``exited`` with ``flushed=1``
once its saves are durable); this module sums those records up for the decision table.

Only the runtime's records count: a script that does not use ``hpctrain.runtime`` gives no
such word, and its death at exit is reported as it happened (with the likely cause and the
fix, :mod:`hpctrain.supervisor.diagnosis`). Pure: the records come in parsed
(:class:`hpctrain.protocol.progress.Progress`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.protocol.progress import Progress


@dataclass(frozen=True)
class Finish:
    """What the ranks of one attempt said as they left, by rank."""

    world: int
    exits: Mapping[int, str]      # rank -> how its script's work ended (return, crash, requeue)
    flushed: frozenset[int]       # ranks whose work is over and whose saves were durable
    steps: Mapping[int, str]      # rank -> the last step it reported ("" if none)

    @classmethod
    def from_records(cls, records: Mapping[int, Progress], world: int) -> Finish:
        """From this attempt's progress records, by rank."""
        exits = {r: rec.exit for r, rec in records.items() if rec.exit}
        return cls(world, exits,
                   frozenset(r for r, rec in records.items()
                             if rec.phase == "exited" and rec.flushed),
                   {r: rec.step for r, rec in records.items()})

    @property
    def done(self) -> bool:
        """Every rank's script returned (no uncaught exception, no requeue) and every
        rank's saves are durable: nothing the job did can be lost any more."""
        ranks = range(self.world)
        return self.world > 0 and all(self.exits.get(r) == "return" and r in self.flushed
                                      for r in ranks)

    @property
    def step(self) -> str:
        """The step the ranks had reached: ``4``, or ``3-4`` when they differ."""
        known = sorted({int(s) for s in self.steps.values() if s.isdigit()})
        if not known:
            return ""
        return str(known[0]) if len(known) == 1 else f"{known[0]}-{known[-1]}"

    def text(self) -> str:
        """``all 4 ranks finished (step 59) with their saves durable``."""
        at = f" (step {self.step})" if self.step else ""
        return f"all {self.world} ranks finished{at} with their saves durable"
