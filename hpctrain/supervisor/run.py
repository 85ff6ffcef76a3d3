"""One run of a job under the supervisor: gather raw facts, decide, act, in a thin loop.

At the start: claim the state directory, enter the requeues nobody counted and judge the
last one against the budget; a stop that came during the set-up is decided at once. Then
the step: start it, pass stop signals on and watch it for hangs
(:mod:`hpctrain.supervisor.hang`), and once it ends decide: finish, requeue, or start the
step again in this allocation. The facts come from :mod:`hpctrain.supervisor.gather`,
every rule from :mod:`hpctrain.supervisor.decision`, the acts from
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
from hpctrain.errors import HpctrainError
from hpctrain.slurm.view import JobView
from hpctrain.supervisor import caches, container, live
from hpctrain.supervisor.actor import Actor
from hpctrain.supervisor.board import Board
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import (Caught, Decision, decide, decide_before_start,
                                          health_check, missing_requeues, needs_sacct,
                                          previous_cause, respond_to_stop, start_verdict,
                                          warning_at, warning_due)
from hpctrain.supervisor.diagnosis import log_segment, log_size
from hpctrain.supervisor.elastic import last_heard
from hpctrain.supervisor.gather import POLL_S, Gather
from hpctrain.supervisor.hang import Watch
from hpctrain.supervisor.inprocess import InProcess
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.nodes import BadNodes
from hpctrain.supervisor.recorder import Recorder
from hpctrain.supervisor.response import HangResponse, kill
from hpctrain.supervisor.scheduler import Scheduler, Slurm, StepProcess
from hpctrain.supervisor.silence import Silence
from hpctrain.supervisor.spares import Spares
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.step import step_env
from hpctrain.supervisor.watchdog import Hang


FORGET_S = 30.0      # removing a run's peer copies from its nodes' memory, at its end
WARN_RETRY_S = 10.0  # the warning due and the controller silent: ask again this much later


class Supervisor:
    """Owns one run of the batch step: see the module docstring."""

    def __init__(self, cfg: Config, slurm: Scheduler) -> None:
        self.cfg, self.slurm = cfg, slurm
        self.state, note = StateDir.claim(cfg.base, cfg.key, cfg.restart_count, cfg.cluster,
                                          cfg.submission)
        if note:
            say(note)
        # excluded when the job is requeued; it needs what it started with, never fewer
        self.bad = BadNodes(slurm, cfg.key, cfg.nodelist, cfg.exclude_bad_nodes,
                            max(cfg.nodes, cfg.job_nodes))
        self.books = Recorder(self.state, cfg.key, cfg.restart_count, slurm.time)
        self.seen = Gather(cfg, slurm, self.state, self.bad)
        self.board = Board()      # the ranks' progress, over the network
        if note := self.board.buffer_note(cfg.world):
            say(note)
        # `hpctrain status` asks it for the board's newest step (not the 15 s summary)
        self.live, note = live.start(self.state, cfg.key, cfg.restart_count, self.board,
                                     cfg.batch_node)
        if note:
            say(note)
        self.actor = Actor(cfg, slurm, self.state, self.books, self.bad, self.board)
        self.inprocess = InProcess(cfg, slurm, self.state, self.seen, self.actor, self.pump)
        self.response = HangResponse(slurm, self.state, self.board, self.pump)
        self._step: StepProcess | None = None    # the step being supervised
        self._forwarded = False
        self._acted: Decision | None = None     # a requeue made before the step ended
        self._warn_at: float | None = None      # when the time-limit warning is due
        self.spares = Spares(cfg, slurm, self.seen, self.bad, self.books)

    def close(self) -> None:
        """The run is over: the live query stops (``status`` reads the final summary), and
        where its verdict ended the job for good, the job's cache directory goes (a
        requeued job keeps it; :mod:`hpctrain.supervisor.caches`)."""
        if self.live is not None:
            self.live.close()
        verdict = self.state.read(p.OUTCOME, self.cfg.restart_count)
        if note := caches.drop(os.environ, verdict.get("action", "")):
            say(note)

    def install(self) -> None:
        """Slurm's stop signals to the batch step are noted, not fatal."""
        for name in dict.fromkeys((self.cfg.requeue_signal, "TERM", "INT")):
            signal.signal(signal.Signals["SIG" + name], self.seen.handler)

    # ---- the run ---------------------------------------------------------------------------
    def run(self) -> int:
        cfg, seen = self.cfg, self.seen
        view = seen.ask()
        last_cause, stop = self.account_restarts()
        self.state.clear(p.STOP, p.EXIT)   # earlier runs' notices and records have been read
        if stop is not None:
            return self.actor.act(stop, None)
        seen.take_signals()
        if cfg.requeue_signal not in {c.name for c in seen.caught} and \
                warning_due(view, cfg.signal_lead_s, self.slurm.time()):
            say(f"the time-limit warning is due (signal_lead_s={cfg.signal_lead_s} before the "
                "job's end, by Slurm's clock): taking it as received")
            seen.caught.append(Caught(cfg.requeue_signal, self.slurm.time(), early=True))
        if decide_before_start(view, cfg.restart_count, seen.caught):
            facts = seen.facts(view)
            return self.actor.act(decide(facts), facts)
        self._warn_at = warning_at(view, cfg.signal_lead_s)
        return self.run_step(view, last_cause)

    def account_restarts(self) -> tuple[str | None, Decision | None]:
        """Enter the requeues no supervisor counted, and judge the last one against the
        budget: (the last requeue's cause or None on a first run, a stop or None)."""
        cfg, state = self.cfg, self.state
        ledger = state.ledger()
        if cfg.restart_count > ledger.last_restart:
            before = cfg.restart_count - 1
            previous = previous_cause(state.read(p.OUTCOME, before), state.read(p.EXIT, before),
                                      state.read(p.STOP, before).get("cause"))
            states = self.slurm.run_states(cfg.key) \
                if needs_sacct(ledger.last_restart, cfg.restart_count, previous) else []
            for restart, cause in missing_requeues(ledger.last_restart, cfg.restart_count,
                                                   previous, states):
                self.books.requeued(cause, restart, by="slurm")
            ledger = state.ledger()
        self.seen.requeues = dict(ledger.requeues)
        last_cause, stop = start_verdict(cfg.budget, ledger, cfg.restart_count)
        if stop is not None:
            say(f"not running job {cfg.key} again after a {stop.cause} requeue: {stop.detail}")
        return last_cause, stop

    def run_step(self, view: JobView | None, last_cause: str | None) -> int:
        """Start the training step and see it to its end, restarting it in this allocation
        while the decision table says so; the batch step's exit code."""
        cfg, seen = self.cfg, self.seen
        logfile = view.std_err if view is not None else ""
        logs = (logfile, view.std_out if view is not None else "")
        argv, notes = container.step_argv(cfg.argv, cfg.container, self.state.path,
                                          cfg.submit_dir)
        for note in notes:
            say(note)
        attempt = 0
        # the progress channel's silence, watched across this run's attempts
        silence = Silence(self.state.path, self.state.run_id, cfg.restart_count,
                          cfg.limits.beat_s, cfg.batch_node, self.board.port, os.environ)
        while True:
            if cfg.health_check and (code := self.check_health(view)) is not None:
                return code
            offset = log_size(logfile) if logfile else 0
            after = f", after a {last_cause}" if last_cause else ""
            again = f", in-place restart {attempt}" if attempt else ""
            placed, where = self.spares.place(argv, view, attempt)
            say(f"starting the training step of job {cfg.key}: {where}, "
                f"restart {cfg.restart_count}{again}{after}")
            channel = {**self.board.env(), **self.seen.rendezvous.env()}
            step = self.slurm.start_step(placed, step_env(cfg, self.state, view, last_cause,
                                                          attempt, channel))
            watch = Watch(self.slurm, self.state, cfg.limits, cfg.world, cfg.restart_count,
                          attempt, logs, cfg.nodes, self.board, silence)
            status, seen.hang, watch = self.supervise(step, watch)
            attempt = watch.attempt
            say(f"training step exited with status {status}" if not seen.lost else
                f"training step ended: node(s) {','.join(seen.lost)} lost")
            if status and cfg.spare_nodes and not seen.lost:
                # no node was found lost: what the watch knew (a lost node heard too lately)
                say("the ranks were last heard: "
                    f"{last_heard(watch.records(), seen.on, self.slurm.time())}")
            facts = seen.at_end(status, watch, log_segment(logfile, offset)
                                if status and logfile else "")
            if seen.unanswered and cfg.spare_nodes:
                self.spares.release(seen.unanswered)    # before Slurm marks them down
            watch.summarize(final=True)     # the ranks' last words are in: the final step
            if self._acted is not None:
                return self._acted.exit_code
            decision = decide(facts)
            diagnosis = facts.failure if decision.about_a_failure else None
            if decision.action != "restart":
                self.forget_copies(facts.view or view)
                return self.actor.act(decision, facts, diagnosis, hang=seen.hang)
            attempt += 1
            last_cause = decision.cause
            self.actor.restart_in_place(decision, facts, attempt, diagnosis, seen.hang)
            view = facts.view or view    # Slurm's newest word on the allocation's nodes

    def forget_copies(self, view: JobView | None) -> None:
        """The run is over (it finishes, or a new one starts elsewhere): the peer copies of
        its snapshots leave the memory of every node still good (a lost one took its own
        along), one task per node (:mod:`hpctrain.protocol.nodemem`)."""
        cfg = self.cfg
        nodes = [n for n in self.seen.allocated(view) if n not in self.bad.found]
        if not cfg.peer_copies or not nodes:
            return
        argv = [sys.executable, "-m", "hpctrain.protocol.nodemem", self.state.run_id,
                str(cfg.restart_count)]
        try:
            self.slurm.run_on(argv, nodes, FORGET_S)
        except HpctrainError as exc:     # the memory goes with the job's end at most sites
            say(f"could not remove the snapshots' copies from node memory ({exc})")

    def check_health(self, view: JobView | None) -> int | None:
        """The partition's health check before each step. None to go on: it passed, or
        (spare nodes) enough good nodes are left for the step without the failed ones;
        else the batch step's exit code once the job is requeued without them, or ended."""
        cfg = self.cfg
        count = len(self.seen.allocated(view)) if cfg.spare_nodes else cfg.nodes
        failed = self.bad.run_check(cfg.health_check, count, cfg.health_check_timeout_s)
        if not failed or (cfg.spare_nodes and self.seen.place(view) is not None):
            return None
        leave_out = self.bad.to_exclude(view)
        return self.actor.act(health_check(failed, leave_out), self.seen.facts(view),
                              leave_out=leave_out, node=",".join(failed))

    def supervise(self, step: StepProcess, watch: Watch) -> tuple[int, Hang | None, Watch]:
        """Wait for the step, passing stop signals on, watching for a hang and restarting
        a failed attempt in its processes when it can (:mod:`.inprocess`); (its exit status,
        the hang that made the supervisor kill it or None, the last attempt's watch: the
        ranks' last words are that attempt's).

        The step is in one of these states, each with one deadline; signals are passed on
        in every one but the kill (each of those waits is a
        :class:`~hpctrain.supervisor.waits.Waiter`; the step the kill ends needs no stop):

        ========== ======================================== ================================
        state      waits for                                deadline
        ========== ======================================== ================================
        running    the step's end, a failure, a hang        none (looks every LOOK_S)
        settling   the other ranks' failures                SETTLE_S quiet, MAX_SETTLE_S
        naming     the ranks' stacks for a hang             3 beats, at least 5 s
        arriving   every rank at the restart point          ARRIVE_S, then new processes
        leaving    the ranks told to stop, leaving          LEAVE_S, then the kill
        killing    the killed step's end                    KILL_WAIT_S
        ========== ======================================== ================================
        """
        self._forwarded = False
        self._step = step
        while True:
            status = step.poll()
            self.pump()
            if status is not None:   # a rank that gave up in a collective: a hang elsewhere
                return status, watch.gave_up() if status else None, watch
            watch.summarize()
            if self.cfg.spare_nodes and (lost := watch.silent(self.seen.on)):
                return self.spares.abandon(step, lost), None, watch
            failed = watch.failed()
            # ranks that gave up waiting in a collective: a hang of those they waited for
            hang = self.response.waited_for(watch, failed) if failed else None
            if failed and hang is None:
                watch = self.inprocess.after_failure(step, watch) or watch
            if self.inprocess.leaving(watch):   # told to stop: the step is ending
                if self.inprocess.overdue():
                    return kill(self.slurm, step, self.cfg.key), None, watch
                self.slurm.sleep(POLL_S)
                continue
            # once a stop was passed on, the ranks save and leave: Slurm's grace bounds that
            if hang is None and not self._forwarded and (hang := watch.look()) is not None:
                hang = self.response.name_culprits(watch, hang, self.cfg.key)
            if hang is not None:
                self.seen.hang = hang
                nxt = self.inprocess.after_hang(step, watch, hang)
                if nxt is None:
                    return kill(self.slurm, step, self.cfg.key), hang, watch
                watch = nxt
            self.slurm.sleep(POLL_S)

    def pump(self) -> None:
        """Pass on the stop signals caught since the last look, at once: from the step
        loop, and from every wait inside it (ranks arriving for an in-process restart,
        stacks of a hang), so a preemption's grace time is never spent waiting."""
        if self._step is None:
            return
        self.miss_no_warning()
        for caught in self.seen.take_signals():
            self.on_stop(caught, self._step)

    def miss_no_warning(self) -> None:
        """Slurm sends the time-limit warning once, up to a minute before its lead (its
        timer looks every 30 s): on a short job it can come before the batch script
        listens, and is lost. So at the lead by Slurm's end time, a run that has caught no
        stop signal takes the warning as received. Slurm is asked again first: an end
        moved later (the limit raised) moves the warning with it."""
        if self._warn_at is None or self.slurm.time() < self._warn_at:
            return
        self._warn_at = None
        if self.seen.caught or self.seen.pending:     # a stop is in hand already
            return
        lead, view = self.cfg.signal_lead_s, self.seen.ask()
        if view is None:      # the controller did not answer: ask again in a while
            self._warn_at = self.slurm.time() + WARN_RETRY_S
            return
        if not warning_due(view, lead, self.slurm.time()):
            self._warn_at = warning_at(view, lead)
            return
        say(f"the time-limit warning is due (signal_lead_s={lead} before the job's end, by "
            "Slurm's clock) and Slurm's did not come: taking it as received")
        self.seen.pending.append(Caught(self.cfg.requeue_signal, self.slurm.time()))

    def on_stop(self, caught: Caught, step: StepProcess) -> None:
        """A stop signal while the step runs: the stop notice, an early requeue, the lost
        node noted, the stop passed on, as :func:`respond_to_stop` says."""
        cfg = self.cfg
        view = self.seen.ask()
        r = respond_to_stop(caught.name, view, cfg.restart_count, cfg.requeue_signal,
                            cfg.step_signal, self._forwarded, self._acted is not None)
        if r.notice is not None:
            self.state.write(p.STOP, {"cause": r.notice, "restart_count": cfg.restart_count,
                                      "signal": caught.name})
        if r.decide_now:
            facts = self.seen.facts(view)
            decision = decide(facts)
            if decision.action == "requeue":   # anything else waits for the step's end
                self.actor.act(decision, facts)
                self._acted = decision
        if r.note_bad_nodes:
            self.bad.check(view)   # the lost node is DOWN now: before anyone returns it
        what = r.notice or r.event
        if r.forward is None:
            say(f"caught SIG{caught.name} ({what})" if self._forwarded else
                f"caught SIG{caught.name} ({what}); Slurm is ending the step itself")
            return
        how = self.actor.forward(r.forward, step)
        self._forwarded = True
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
