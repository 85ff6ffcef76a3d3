"""One run of a job under the supervisor: gather raw facts, decide, act, in a thin loop.

At the start: claim the state directory, enter the requeues nobody counted and judge the
last one against the budget; a stop that came during the set-up is decided at once. Then
the step (:class:`~hpctrain.supervisor.steploop.StepLoop`): start it, pass stop signals on
and watch it for hangs, and once it ends decide: finish, requeue, or start the step again
in this allocation. The run's state is one :class:`~hpctrain.supervisor.runstate.RunState`,
owned here and passed down; the facts come from :mod:`hpctrain.supervisor.gather`, every
rule from :mod:`hpctrain.supervisor.decision`, the acts from
:mod:`hpctrain.supervisor.actor`; Slurm, the step's process and the clock from one
:class:`~hpctrain.supervisor.scheduler.Scheduler`, which a test replaces
(tests/unit/test_supervisor_matrix.py).

The rendered script ends with ``exec python -m hpctrain.supervisor -- <launcher argv>``,
so this process *is* the batch step: Slurm's signals to the batch shell come here. Until
its handlers are installed the script ignores them (an ignored signal survives exec, a
trapped one would not), and whatever may have been missed is asked of Slurm at start.
"""

from __future__ import annotations

import os
import signal
import sys

from hpctrain import protocol as p
from hpctrain.protocol.records import StopNotice
from hpctrain.errors import HpctrainError
from hpctrain.supervisor.actor import Actor
from hpctrain.supervisor.board import Board
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import (Caught, Decision, decide, decide_before_start,
                                          missing_requeues, needs_sacct, previous_cause,
                                          respond_to_stop, start_verdict, warning_at,
                                          warning_due)
from hpctrain.supervisor.gather import Gather
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.runstate import RunState
from hpctrain.supervisor.scheduler import Scheduler, Slurm, StepProcess
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.steploop import StepLoop

WARN_RETRY_S = 10.0  # the warning due and the controller silent: ask again this much later


class Supervisor:
    """Owns one run of the batch step: see the module docstring."""

    def __init__(self, cfg: Config, slurm: Scheduler) -> None:
        self.cfg, self.slurm = cfg, slurm
        self.state, note = StateDir.claim(cfg.base, cfg.key, cfg.restart_count, cfg.cluster,
                                          cfg.submission)
        if note:
            say(note)
        self.run_state = RunState(caught=list(cfg.early), clock=slurm.time)
        self.seen = Gather(cfg, slurm, self.state, self.run_state)
        self.board = Board()      # the ranks' progress, over the network
        if note := self.board.buffer_note(cfg.world):
            say(note)
        self.actor = Actor(cfg, slurm, self.state, self.run_state, self.board)
        self.steps = StepLoop(cfg, slurm, self.state, self.seen, self.run_state, self.actor,
                              self.board, self.pump)

    def close(self) -> None:
        """The run is over: the live query stops (``status`` reads the final summary), and
        where its verdict ended the job for good, the job's caches go (:meth:`Actor.tidy`)."""
        self.steps.close()
        self.actor.tidy()

    def install(self) -> None:
        """Slurm's stop signals to the batch step are noted, not fatal."""
        for name in dict.fromkeys((self.cfg.requeue_signal, "TERM", "INT")):
            signal.signal(signal.Signals["SIG" + name], self.run_state.handler)

    # ---- the run ---------------------------------------------------------------------------
    def run(self) -> int:
        cfg, run = self.cfg, self.run_state
        view = self.seen.ask()
        last_cause, stop = self.account_restarts()
        self.state.clear(p.STOP, p.EXIT)   # earlier runs' notices and records have been read
        if stop is not None:
            return self.actor.act(stop, None)
        run.take_signals()
        if cfg.requeue_signal not in {c.name for c in run.caught} and \
                warning_due(view, cfg.signal_lead_s, self.slurm.time()):
            say(f"the time-limit warning is due (signal_lead_s={cfg.signal_lead_s} before the "
                "job's end, by Slurm's clock): taking it as received")
            run.caught.append(Caught(cfg.requeue_signal, self.slurm.time(), early=True))
        if decide_before_start(view, cfg.restart_count, run.caught):
            facts = self.seen.facts(view)
            return self.actor.act(decide(facts), facts)
        run.warn_at = warning_at(view, cfg.signal_lead_s)
        return self.steps.run_steps(view, last_cause)

    def account_restarts(self) -> tuple[str | None, Decision | None]:
        """Enter the requeues no supervisor counted, and judge the last one against the
        budget: (the last requeue's cause or None on a first run, a stop or None)."""
        cfg, state = self.cfg, self.state
        ledger = state.ledger()
        if cfg.restart_count > ledger.last_restart:
            before = cfg.restart_count - 1
            said = state.stop_notice(before)
            previous = previous_cause(state.verdict(before), state.exit_record(before),
                                      said.cause if said is not None else None)
            states = self.slurm.run_states(cfg.key) \
                if needs_sacct(ledger.last_restart, cfg.restart_count, previous) else []
            for restart, cause in missing_requeues(ledger.last_restart, cfg.restart_count,
                                                   previous, states):
                self.actor.books.requeued(cause, restart, by="slurm")
            ledger = state.ledger()
        self.run_state.requeues = dict(ledger.requeues)
        last_cause, stop = start_verdict(cfg.budget, ledger, cfg.restart_count)
        if stop is not None:
            say(f"not running job {cfg.key} again after a {stop.cause} requeue: {stop.detail}")
        return last_cause, stop

    # ---- stop signals, taken in every wait -------------------------------------------------
    def pump(self) -> None:
        """Pass on the stop signals caught since the last look, at once: from the step
        loop, and from every wait inside it (ranks arriving for an in-process restart,
        stacks of a hang), so a preemption's grace time is never spent waiting."""
        step = self.run_state.step
        if step is None:
            return
        self.take_missed_warning()
        for caught in self.run_state.take_signals():
            self.on_stop(caught, step)

    def take_missed_warning(self) -> None:
        """Slurm sends the time-limit warning once, up to a minute before its lead (its
        timer looks every 30 s): on a short job it can come before the batch script
        listens, and is lost. So at the lead by Slurm's end time, a run that has caught no
        stop signal takes the warning as received. Slurm is asked again first: an end
        moved later (the limit raised) moves the warning with it."""
        run = self.run_state
        if run.warn_at is None or self.slurm.time() < run.warn_at:
            return
        run.warn_at = None
        if run.caught or run.pending:     # a stop is in hand already
            return
        lead, view = self.cfg.signal_lead_s, self.seen.ask()
        if view is None:      # the controller did not answer: ask again in a while
            run.warn_at = self.slurm.time() + WARN_RETRY_S
            return
        if not warning_due(view, lead, self.slurm.time()):
            run.warn_at = warning_at(view, lead)
            return
        say(f"the time-limit warning is due (signal_lead_s={lead} before the job's end, by "
            "Slurm's clock) and Slurm's did not come: taking it as received")
        run.pending.append(Caught(self.cfg.requeue_signal, self.slurm.time()))

    def on_stop(self, caught: Caught, step: StepProcess) -> None:
        """A stop signal while the step runs: the stop notice, an early requeue, the lost
        node noted, the stop passed on, as :func:`respond_to_stop` says."""
        cfg, run = self.cfg, self.run_state
        view = self.seen.ask()
        r = respond_to_stop(caught.name, view, cfg.restart_count, cfg.requeue_signal,
                            cfg.step_signal, run.forwarded, run.acted is not None)
        if r.notice is not None:
            self.state.write(p.STOP, StopNotice(r.notice, cfg.restart_count,
                                                caught.name).fields())
        if r.decide_now:
            facts = self.seen.facts(view)
            decision = decide(facts)
            if decision.action == "requeue":   # anything else waits for the step's end
                self.actor.act(decision, facts)
                run.acted = decision
        if r.note_bad_nodes:
            self.actor.bad.check(view)   # the lost node is DOWN now: before anyone returns it
        what = r.notice or r.event
        if r.forward is None:
            say(f"caught SIG{caught.name} ({what})" if run.forwarded else
                f"caught SIG{caught.name} ({what}); Slurm is ending the step itself")
            return
        how = self.actor.forward(r.forward, step)
        run.forwarded = True
        say(f"caught SIG{caught.name} ({r.notice or 'no preemption or time limit'}); "
            f"asking the training step to stop: {how}")


def main(argv: list[str] | None = None) -> int:
    """``python -m hpctrain.supervisor -- LAUNCHER ...`` (the rendered script's last line)."""
    try:
        cfg = Config.from_env(sys.argv[1:] if argv is None else argv, os.environ)
        supervisor = Supervisor(cfg, Slurm())
        supervisor.install()
        try:
            return supervisor.run()
        finally:
            supervisor.close()
    except HpctrainError as exc:
        say(f"error: {exc}")
        return exc.exit_code
