"""The state of one run of the batch step: what it has seen and done so far. One object,
owned by the :class:`~hpctrain.supervisor.run.Supervisor` and passed down; each field
names the one place that writes it. :class:`~hpctrain.supervisor.gather.Gather` only reads
it for the facts of a decision.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING

from hpctrain.supervisor.decision import Caught, Decision

if TYPE_CHECKING:
    from hpctrain.supervisor.scheduler import StepProcess
    from hpctrain.supervisor.watchdog import Hang


@dataclass
class RunState:
    """One run's mutable state (see the module docstring)."""

    caught: list[Caught] = field(default_factory=list)   # stop signals taken: take_signals
    pending: list[Caught] = field(default_factory=list)  # ...noted, not yet taken: handler
    requeues: dict[str, int] = field(default_factory=dict)   # the ledger's, at start:
    #                                                          Supervisor.account_restarts
    hang: Hang | None = None         # what the watchdog found in this attempt: StepLoop
    on: list[str] = field(default_factory=list)   # [elastic] the step's nodes: Spares.place
    lost: tuple[str, ...] = ()       # ...found lost while it ran: NodeLoss (abandon; at_end
    #                                   takes them into the facts and clears them)
    slow: tuple[str, ...] = ()       # ...taken out of it for slowness: NodeLoss (take_out;
    #                                   cleared as lost)
    unanswered: tuple[str, ...] = ()  # nodes a failed step's end found lost: NodeLoss.at_end
    #                                   (NodeProbe's answer)
    bad: dict[str, str] = field(default_factory=dict)   # node -> why it is bad: BadNodes.note
    faulty: tuple[str, ...] = ()     # nodes whose ranks died wordless, answering: NodeLoss.at_end
    retried: set[str] = field(default_factory=set)   # ...given their one retry: NodeLoss
    given_back: list[str] = field(default_factory=list)   # nodes taken from the job (Slurm
    #                                   keeps the smaller size for a requeue): NodeLoss.release
    step: StepProcess | None = None  # the step being supervised: StepLoop.watch
    forwarded: bool = False          # a stop was passed on to its ranks: Supervisor.on_stop
    #                                   (cleared for each step: StepLoop.watch)
    acted: Decision | None = None    # a requeue made before the step ended: on_stop
    warn_at: float | None = None     # when the time-limit warning is due: Supervisor
    clock: Callable[[], float] = time.time   # the scheduler's (a test's fake one)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        """The batch step's handler of Slurm's stop signals: record only (no I/O and no
        locks inside a handler)."""
        self.pending.append(Caught(signal.Signals(signum).name[3:], self.clock()))

    def take_signals(self) -> list[Caught]:
        """The stop signals noted since the last look, now taken."""
        new = self.pending[:]
        del self.pending[:len(new)]
        self.caught += new
        return new
