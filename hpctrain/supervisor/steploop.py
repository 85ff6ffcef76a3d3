"""The training step's loop inside one run: start the step, watch it through the states of
:meth:`StepLoop.watch`'s table (one handler and one deadline each, stop signals taken in
every wait), gather the facts once it ends, decide, and start it again in this allocation
while the decision table says so. The run's state is the
:class:`~hpctrain.supervisor.runstate.RunState` the supervisor owns; the facts come from
:class:`~hpctrain.supervisor.gather.Gather`, every rule from
:mod:`hpctrain.supervisor.decision`, the acts from the actors (:mod:`.actor`, :mod:`.nodes`,
:mod:`.spares`, :mod:`.inprocess`, :mod:`.response`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from hpctrain.errors import HpctrainError
from hpctrain.protocol.progress import Progress
from hpctrain.slurm.view import JobView
from hpctrain.supervisor import container, live
from hpctrain.supervisor.actor import Actor
from hpctrain.supervisor.board import Board
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import Facts, decide, health_check
from hpctrain.supervisor.diagnosis import log_segment, log_size
from hpctrain.supervisor.gather import ASK_DEADLINE_S, POLL_S, Gather
from hpctrain.supervisor.hang import Watch
from hpctrain.supervisor.inprocess import InProcess
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.nodeloss import NodeLoss
from hpctrain.supervisor.response import HangResponse, kill
from hpctrain.supervisor.runstate import RunState
from hpctrain.supervisor.scheduler import Scheduler, StepProcess
from hpctrain.supervisor.silence import Silence
from hpctrain.supervisor.slownodes import SlowNodes
from hpctrain.supervisor.spares import Spares
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.step import step_env
from hpctrain.supervisor.watchdog import Hang

FORGET_S = 30.0      # removing a run's peer copies from its nodes' memory, at its end


@dataclass
class Watching:
    """Where a watched step is: its state in :meth:`StepLoop.watch`'s table, the attempt's
    watch, and what the next handler needs."""

    state: str
    watch: Watch
    failed: dict[int, Progress] | None = None   # ranks whose attempt failed (settling)
    hang: Hang | None = None                    # the hang found (naming, arriving, killing)
    status: int | None = None                   # the step's exit status (ended)


class StepLoop:
    """The step of one run, from its first start to the decision that ends the run."""

    def __init__(self, cfg: Config, slurm: Scheduler, state: StateDir, seen: Gather,
                 run: RunState, actor: Actor, board: Board, pump: Callable[[], None]) -> None:
        self.cfg, self.slurm, self.state, self.seen, self.run = cfg, slurm, state, seen, run
        self.actor, self.board, self.pump = actor, board, pump
        self.inprocess = InProcess(cfg, slurm, state, seen, run, actor, pump)
        self.response = HangResponse(slurm, state, board, pump)
        self.spares = Spares(cfg, slurm, seen, run, actor.bad, actor.books)
        self.losses = NodeLoss(cfg, slurm, seen, run, actor.bad, self.step_nodes)
        self.slow = SlowNodes(cfg, slurm, seen, run, actor.bad, actor.books, self.losses)
        # `hpctrain status` asks it for the board's newest step (not the 15 s summary)
        self.live, note = live.start(state, cfg.key, cfg.restart_count, board, cfg.batch_node)
        if note:
            say(note)

    def close(self) -> None:
        """The run is over: the live query stops (``status`` reads the final summary)."""
        if self.live is not None:
            self.live.close()

    def step_nodes(self) -> list[str]:
        """The nodes the step runs on ([elastic]: the ones placed), else the allocation's."""
        return self.run.on or self.seen.allocated(None)

    # ---- the run's steps -------------------------------------------------------------------
    def run_steps(self, view: JobView | None, last_cause: str | None) -> int:
        """Start the training step and see it to its end, restarting it in this allocation
        while the decision table says so; the batch step's exit code."""
        cfg, run = self.cfg, self.run
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
            if cfg.preflight and attempt == 0:   # each run's first step: a slow node left out
                self.slow.preflight(view)
            offset = log_size(logfile) if logfile else 0
            after = f", after a {last_cause}" if last_cause else ""
            again = f", in-place restart {attempt}" if attempt else ""
            placed, where = self.spares.place(argv, view, attempt)
            say(f"starting the training step of job {cfg.key}: {where}, "
                f"restart {cfg.restart_count}{again}{after}")
            channel = {**self.board.env(), **self.seen.rendezvous.env()}
            world = self.spares.world              # fewer ranks after a shrink
            step = self.slurm.start_step(placed, step_env(cfg, self.state, view, last_cause,
                                                          attempt, channel, world))
            watch = Watch(self.slurm, self.state, cfg.limits, world, cfg.restart_count,
                          attempt, logs, world * cfg.nodes // cfg.world, self.board, silence)
            self.slow.begin(attempt)
            status, run.hang, watch = self.watch(step, watch)
            attempt = watch.attempt
            self.losses.said_end(status, watch)
            self.slow.said()               # what the slow-node watch saw of this attempt
            facts = self.ended(status, watch, log_segment(logfile, offset)
                               if status and logfile else "")
            self.losses.release_left()
            watch.summarize(final=True)     # the ranks' last words are in: the final step
            if run.acted is not None:
                return run.acted.exit_code
            decision = decide(facts)
            diagnosis = facts.failure if decision.about_a_failure else None
            if decision.action != "restart":
                self.forget_copies(facts.view or view)
                return self.actor.act(decision, facts, diagnosis, hang=run.hang)
            attempt += 1
            last_cause = decision.cause
            self.actor.restart_in_place(decision, facts, attempt, diagnosis, run.hang)
            view = facts.view or view    # Slurm's newest word on the allocation's nodes

    def ended(self, status: int, watch: Watch, log: str) -> Facts:
        """The facts once the step has ended (``log``: this run's part of the job log):
        Slurm's view, given its time to speak of a failure nobody explains, and what the
        end found of the step's nodes (:class:`~hpctrain.supervisor.nodeloss.NodeLoss`)."""
        seen = self.seen
        view = self.losses.wait_for_word(status, watch, log, seen.ask(ASK_DEADLINE_S))
        failure = seen.failure(log) if status else None
        nodes = self.losses.at_end(status, failure, watch, log, view)
        return seen.at_end(status, watch, log, view, failure, nodes)

    def check_health(self, view: JobView | None) -> int | None:
        """The partition's health check before each step. None to go on: it passed, or
        (spare nodes) enough good nodes are left for the step without the failed ones;
        else the batch step's exit code once the job is requeued without them, or ended."""
        cfg, bad = self.cfg, self.actor.bad
        count = len(self.seen.allocated(view)) if cfg.elastic else cfg.nodes
        failed = bad.run_check(cfg.health_check, count, cfg.health_check_timeout_s)
        if not failed or (cfg.elastic and self.spares.nodes_for(view, full=True) is not None):
            return None
        leave_out = bad.to_exclude(view)
        return self.actor.act(health_check(failed, leave_out), self.seen.facts(view),
                              leave_out=leave_out, node=",".join(failed))

    def forget_copies(self, view: JobView | None) -> None:
        """The run is over (it finishes, or a new one starts elsewhere): the peer copies of
        its snapshots leave the memory of every node still good (a lost one took its own
        along), one task per node (:mod:`hpctrain.protocol.nodemem`)."""
        cfg = self.cfg
        nodes = [n for n in self.seen.allocated(view) if n not in self.actor.bad.found]
        if not cfg.peer_copies or not nodes:
            return
        argv = [sys.executable, "-m", "hpctrain.protocol.nodemem", self.state.run_id,
                str(cfg.restart_count)]
        try:
            self.slurm.run_on(argv, nodes, FORGET_S)
        except HpctrainError as exc:     # the memory goes with the job's end at most sites
            say(f"could not remove the snapshots' copies from node memory ({exc})")

    # ---- one step, watched -----------------------------------------------------------------
    def watch(self, step: StepProcess, watch: Watch) -> tuple[int, Hang | None, Watch]:
        """Wait for the step, passing stop signals on, watching for a hang and restarting
        a failed attempt in its processes when it can (:mod:`.inprocess`); (its exit status,
        the hang that made the supervisor kill it or None, the last attempt's watch: the
        ranks' last words are that attempt's).

        The step is in one of these states, each with its handler (``_<state>``) and one
        deadline; signals are passed on in every one but the kill (each of those waits is
        a :class:`~hpctrain.supervisor.waits.Waiter`; the step the kill ends needs no stop):

        ========== ======================================== ================================
        state      waits for                                deadline
        ========== ======================================== ================================
        running    the step's end, a failure, a hang        none (looks every POLL_S)
        settling   the other ranks' failures                SETTLE_S quiet, MAX_SETTLE_S
        naming     the ranks' stacks for a hang             3 beats, at least 5 s
        arriving   every rank at the restart point          ARRIVE_S, then new processes
        leaving    the ranks told to stop, leaving          LEAVE_S, then the kill
        killing    the killed step's end                    KILL_WAIT_S
        ========== ======================================== ================================
        """
        self.run.forwarded = False
        self.run.step = step
        at = Watching("running", watch)
        while at.state != "ended":
            at = getattr(self, f"_{at.state}")(step, at)
        assert at.status is not None
        return at.status, at.hang, at.watch

    def _running(self, step: StepProcess, at: Watching) -> Watching:
        watch = at.watch
        status = step.poll()
        self.pump()
        if status is not None:   # a rank that gave up in a collective: a hang elsewhere
            return Watching("ended", watch, status=status,
                            hang=watch.gave_up() if status else None)
        watch.summarize()
        if (status := self.losses.silent(step, watch)) is not None:
            return Watching("ended", watch, status=status)
        if (status := self.slow.look(step, watch)) is not None:    # taken out for a spare
            return Watching("ended", watch, status=status)
        if failed := watch.failed():
            return Watching("settling", watch, failed=failed)
        # once a stop was passed on, the ranks save and leave: Slurm's grace bounds that
        if not self.run.forwarded and (hang := watch.look()) is not None:
            return Watching("naming", watch, hang=hang)
        self.slurm.sleep(POLL_S)
        return at

    def _settling(self, step: StepProcess, at: Watching) -> Watching:
        """Ranks of the attempt failed: the others' failures settle; ranks that gave up
        waiting in a collective make it a hang of those they waited for (named)."""
        assert at.failed is not None
        hang = self.response.hang_behind(at.watch, at.failed)
        return Watching("arriving", at.watch, hang=hang)

    def _naming(self, step: StepProcess, at: Watching) -> Watching:
        """The watchdog found a hang: every rank's stacks, and the culprits named."""
        assert at.hang is not None
        hang = self.response.name_culprits(at.watch, at.hang, self.cfg.key)
        return Watching("arriving", at.watch, hang=hang)

    def _arriving(self, step: StepProcess, at: Watching) -> Watching:
        """A failed or hung attempt: its ranks asked to the restart point in their
        processes; running on in the next attempt, else leaving (told to stop) or the
        kill (a hang they could not leave)."""
        if at.hang is None:
            nxt = self.inprocess.after_failure(step, at.watch)
            if nxt is not None:
                self.run.hang = None      # the next attempt starts clean
                self.slow.begin(nxt.attempt)
                return Watching("running", nxt)
            return Watching("leaving" if self.inprocess.leaving(at.watch) else "running",
                            at.watch)
        self.run.hang = at.hang
        nxt = self.inprocess.after_hang(step, at.watch, at.hang)
        if nxt is None:
            return Watching("killing", at.watch, hang=at.hang)
        self.run.hang = None
        self.slow.begin(nxt.attempt)
        return Watching("running", nxt)

    def _leaving(self, step: StepProcess, at: Watching) -> Watching:
        """The ranks were told to stop: their exception goes on and the step ends, or it
        is killed once LEAVE_S have passed (a rank stuck in C)."""
        watch = at.watch
        status = step.poll()
        self.pump()
        if status is not None:
            return Watching("ended", watch, status=status,
                            hang=watch.gave_up() if status else None)
        watch.summarize()
        # a node found lost meanwhile (its ranks silent: the reason they could not all
        # arrive) is taken from the job now, before Slurm marks it down and ends the run
        if (status := self.losses.silent(step, watch)) is not None:
            return Watching("ended", watch, status=status)
        if self.inprocess.overdue():
            return Watching("killing", at.watch)
        self.slurm.sleep(POLL_S)
        return at

    def _killing(self, step: StepProcess, at: Watching) -> Watching:
        return Watching("ended", at.watch, status=kill(self.slurm, step, self.cfg.key),
                        hang=at.hang)
