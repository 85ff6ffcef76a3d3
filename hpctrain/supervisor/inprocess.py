"""Restarts inside the running processes (``hpctrain.runtime.run``): the supervisor's side
of the protocol in :mod:`hpctrain.runtime.restart`.

A failed attempt (a rank raised): that rank says so in its progress record (phase
``restarting``) and waits; the supervisor asks every other rank to leave the attempt too
(the ``interrupt`` record: a rank waiting for the failed one in a collective is freed),
waits for every rank (``ARRIVE_S``), decides as for any restart in the allocation (the decision
table: the budget, a node Slurm calls unhealthy, the time left), and says ``go`` in the
``resume`` record (the ledger's restart line says ``mode=inprocess``) or ``stop``: the
exception then goes on, the processes end, and the table decides the step's end like any
other.

A hang: when every rank can restart in its own process, answered the stack request (its
Python still runs: not frozen, not gone) and the table says restart, every rank is asked to
leave its attempt (the ``interrupt`` record) instead of the step being killed; then as
above. A rank that does not arrive in time (stuck in C, frozen, killed) gets the step
killed and restarted in new processes.
"""

from __future__ import annotations

from collections.abc import Callable

from hpctrain.protocol import timeouts as t
from hpctrain.protocol.dialog import Interrupt, Resume
from hpctrain.supervisor.actor import Actor
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import Decision, Facts, decide
from hpctrain.supervisor.gather import Gather
from hpctrain.supervisor.hang import Watch
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.nodeloss import others_silent
from hpctrain.supervisor.runstate import RunState
from hpctrain.supervisor.scheduler import Scheduler, StepProcess
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.waits import Waiter
from hpctrain.supervisor.watchdog import Hang

# the dialog's clocks, which must nest with the ranks': hpctrain.protocol.timeouts
ARRIVE_S, ARRIVE_POLL_S, LEAVE_S = t.ARRIVE_S, t.ARRIVE_POLL_S, t.LEAVE_S


class InProcess:
    """Decides and tells the ranks of one step whether their next attempt starts in place."""

    def __init__(self, cfg: Config, slurm: Scheduler, state: StateDir, seen: Gather,
                 run: RunState, actor: Actor, pump: Callable[[], None] = lambda: None) -> None:
        self.cfg, self.slurm, self.state, self.seen, self.actor = cfg, slurm, state, seen, actor
        self.run = run
        self.waiter = Waiter(slurm, pump)    # stop signals taken while it waits
        self._stopped = -1   # the attempt told to stop: its ranks are leaving
        self._stopped_at = 0.0

    def leaving(self, watch: Watch) -> bool:
        """Were the ranks of ``watch``'s attempt told to stop? Then the step is ending:
        no hang to find in it (they wait for nothing)."""
        return watch.attempt == self._stopped

    def overdue(self) -> bool:
        """Told to stop LEAVE_S ago, and the step still runs (a rank stuck in C, which its
        launcher did not end): it must be killed."""
        return self.slurm.monotonic() - self._stopped_at > LEAVE_S

    def after_failure(self, step: StepProcess, watch: Watch) -> Watch | None:
        """Ranks of ``watch``'s attempt failed in their processes: the next attempt's watch
        when it starts in them; None when the ranks were told to stop (the step ends)."""
        if watch.attempt == self._stopped:
            return None
        # the others may wait for the failed rank in a collective: end it for them
        self.interrupt(watch)
        arrived = self.arrive(step, watch)
        facts = self.facts()
        decision = decide(facts)
        # a rank may say its process cannot start another attempt (a device error)
        able = arrived and watch.inprocess()
        if able and decision.action == "restart":
            return self.go(decision, facts, watch)
        self.stop(watch, decision if able else None,
                  "" if able or not arrived else "a rank's process cannot (a device error)")
        return None

    def after_hang(self, step: StepProcess, watch: Watch, hang: Hang) -> Watch | None:
        """A hang the watchdog found (its culprits named): the next attempt's watch when
        the ranks left it in their processes; None when the step must be killed."""
        if hang.phase == "exited" or hang.frozen_nodes or not watch.inprocess():
            return None
        facts = self.facts()
        decision = decide(facts)
        if decision.action != "restart":
            return None
        say("asking every rank to leave the hung attempt in its process (hpctrain.runtime.run)")
        self.interrupt(watch)
        if not self.arrive(step, watch):
            return None
        return self.go(decision, facts, watch)

    def facts(self) -> Facts:
        """The failed attempt's facts: the nodes whose ranks froze in a hang noted bad
        first, else those Slurm calls unhealthy (the actors note them)."""
        hang, bad = self.run.hang, self.actor.bad
        frozen = hang.frozen_nodes if hang is not None else ()
        bad.note({node: "hang" for node in frozen})
        view = self.seen.ask()
        return self.seen.failed_attempt(view, {} if frozen else bad.check(view))

    def interrupt(self, watch: Watch) -> None:
        """Ask every rank of the attempt to leave it, wherever it waits."""
        self.actor.board.ask(Interrupt(self.actor.address(watch.attempt),
                                       f"{self.slurm.time():.3f}"))

    def arrive(self, step: StepProcess, watch: Watch) -> bool:
        """Wait until every rank of the attempt waits for the word; False when one does not
        within ARRIVE_S, or the step ends meanwhile."""
        lost: tuple[str, ...] = ()

        def arrived() -> bool:
            nonlocal lost
            records = watch.records()
            if len(records) == watch.world and all(r.phase == "restarting"
                                                   for r in records.values()):
                return True
            # [elastic] the missing ranks' node is gone: they never will
            lost = others_silent(watch, self.run.on, self.cfg.batch_node) \
                if self.cfg.elastic else ()
            return bool(lost)

        if self.waiter.until(arrived, ARRIVE_S, ARRIVE_POLL_S, step) and not lost:
            return True
        if lost:
            say(f"the ranks on {','.join(lost)} went silent: no attempt in place")
        else:
            say(f"not every rank left attempt {watch.attempt} in its process within "
                f"{ARRIVE_S:.0f} s: no restart in these processes")
        return False

    def go(self, decision: Decision, facts: Facts, watch: Watch) -> Watch:
        self.actor.resume(decision, facts, watch.attempt + 1, self.run.hang)
        return watch.next()

    def stop(self, watch: Watch, decision: Decision | None, why: str = "") -> None:
        """The ranks leave: their exception goes on and the step ends."""
        why = why or (f"the decision is to {decision.action} ({decision.cause})" if decision
                      else "not every rank could")
        # what follows is decided once the step has ended, from how it ended (a restart in
        # new processes within the budget, a requeue, or the end): never promised here
        say(f"not restarting attempt {watch.attempt} in its processes: {why}; the ranks "
            f"are told to leave (the step is killed if they have not within {LEAVE_S:.0f} s)")
        self._stopped, self._stopped_at = watch.attempt, self.slurm.monotonic()
        self.actor.board.ask(Resume(self.actor.address(watch.attempt + 1), "stop"))
