"""The raw facts of one run, as the supervisor gathers them for the decisions: Slurm's view
of the job (retried while the controller does not answer), the stop signals the batch step
caught, the ranks' records in the state directory, the first failure in the job log, the
allocation's nodes and the clock. Nothing here decides (:mod:`hpctrain.supervisor.decision`).
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

from hpctrain import hostlist
from hpctrain import protocol as p
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import Caught, Facts, InPlace, slurm_event
from hpctrain.supervisor.diagnosis import Diagnosis, diagnose, memory_kill
from hpctrain.supervisor.elastic import step_nodes
from hpctrain.supervisor.hang import FINISH_WAIT_S, Watch
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.lost import suspects
from hpctrain.supervisor.nodes import BadNodes
from hpctrain.supervisor.rendezvous import Rendezvous
from hpctrain.supervisor.scheduler import NodeAnswers, Scheduler, answered
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.waits import Waiter
from hpctrain.supervisor.watchdog import Hang

POLL_S = 0.1                 # how often the step and the signal log are looked at
SETTLE_S = 3.0               # a failed step Slurm has no word on yet: wait this long for one
ASK_DEADLINE_S = 60.0        # keep asking an unreachable controller this long for the verdict
PROBE_S = 30.0               # a node asked for a step (a lost one fails after MessageTimeout)


class Gather:
    """What one run of a job has seen so far, and the facts for each decision."""

    def __init__(self, cfg: Config, slurm: Scheduler, state: StateDir, bad: BadNodes) -> None:
        self.cfg, self.slurm, self.state, self.bad = cfg, slurm, state, bad
        self.caught: list[Caught] = list(cfg.early)
        self.pending: list[Caught] = []        # by the signal handler (and a missed warning)
        self.hang: Hang | None = None          # what the watchdog found in this attempt
        self.requeues: dict[str, int] = {}     # the ledger's counts by cause, at start
        self.on: list[str] = []                # [elastic]: the nodes the step runs on
        self.lost: tuple[str, ...] = ()        # ...and those of them found lost
        self.unanswered: tuple[str, ...] = ()  # nodes a failed step's end found lost
        self.rendezvous = Rendezvous(cfg.master_addr, cfg.master_port, cfg.batch_node)

    # ---- stop signals ----------------------------------------------------------------------
    def handler(self, signum: int, frame: FrameType | None) -> None:
        # record only: no I/O and no locks inside a handler
        self.pending.append(Caught(signal.Signals(signum).name[3:], self.slurm.time()))

    def take_signals(self) -> list[Caught]:
        new = self.pending[:]
        del self.pending[:len(new)]
        self.caught += new
        return new

    # ---- Slurm and the facts -----------------------------------------------------------------
    def ask(self, deadline_s: float = 0.0) -> JobView | None:
        """Slurm's view of this job; None when it cannot be asked (after ``deadline_s`` of
        retries) or no longer knows the job."""
        key = self.cfg.key
        done, view = answered(self.slurm, lambda: self.slurm.show_job(key),
                              f"scontrol show job {key}", deadline_s)
        return view if done else None

    def facts(self, view: JobView | None, status: int | None = None, **more: Any) -> Facts:
        """The facts for a decision now: Slurm's ``view``, the step's ``status`` (None: it
        has not ended, or never started), the signals and the hang so far, and ``more``."""
        cfg, hang = self.cfg, self.hang
        return Facts(restart_count=cfg.restart_count, requeue_signal=cfg.requeue_signal,
                     budget=cfg.budget, requeues=self.requeues, view=view,
                     now=self.slurm.time(), status=status, caught=tuple(self.caught),
                     hang=hang.text() if hang else None,
                     hang_phase=hang.phase if hang else "", **more)

    def at_end(self, status: int, watch: Watch, log: str) -> Facts:
        """The facts once the step has ended (``log``: this run's part of the job log, for
        the first failure). A failure Slurm has no word on yet (say, a node it has not
        noticed losing) gets SETTLE_S for Slurm to speak, while the nodes where ranks died
        without a word are asked for a step (:meth:`ask_early`)."""
        cfg, state = self.cfg, self.state
        view = self.ask(ASK_DEADLINE_S)
        early = None
        # (a hang's step was killed by the supervisor itself: nothing for Slurm to add)
        if status != 0 and not self.caught and self.hang is None and not self.lost and \
                slurm_event(view, cfg.restart_count) == "running":
            end = self.slurm.monotonic() + SETTLE_S
            early = self.ask_early(watch, log)
            while self.slurm.monotonic() < end and not self.take_signals():
                self.slurm.sleep(POLL_S)
            view = self.ask(ASK_DEADLINE_S)
        record = state.read(p.EXIT, cfg.restart_count)
        run_state = notice = None
        if slurm_event(view, cfg.restart_count) == "requeued":
            states = self.slurm.run_states(cfg.key)
            run_state = states[cfg.restart_count] if len(states) > cfg.restart_count else None
            notice = state.read(p.STOP, cfg.restart_count).get("cause")
        ledger = state.ledger()
        # a rank's "exited" may still be on its way beside its exit: a moment for it
        Waiter(self.slurm).until(lambda: not watch.exiting(), FINISH_WAIT_S, 0.05)
        failure = diagnose(log, cfg.launcher, record) if status else None
        memory = memory_kill(log) if status else None
        self.unanswered = () if not status or memory or self.caught or self.hang or \
            self.lost else self.ask_nodes(failure, watch, log, early)
        inplace = self.allocation(view, ledger.step_restarts) if status else InPlace()
        return self.facts(view, status, record=record, run_state=run_state, notice=notice,
                          restarts=ledger.restarts, inplace=inplace,
                          lost=self.lost_nodes(view) if status else (),
                          finish=watch.finish(), failure=failure, memory=memory,
                          port=self.rendezvous.moved(log) if status else None,
                          wrapped=watch.wrapped(), crashes=ledger.crashes)

    def ask_early(self, watch: Watch, log: str) -> NodeAnswers | None:
        """The nodes :meth:`ask_nodes` will ask, asked already while Slurm is given its
        SETTLE_S to speak (a lost node's answer takes a MessageTimeout: the two waits
        overlap). Judged on the facts so far; :meth:`ask_nodes` judges again on those
        after the wait and uses these answers only when it asks the same nodes."""
        Waiter(self.slurm).until(lambda: not watch.exiting(), FINISH_WAIT_S, 0.05)
        if memory_kill(log):
            return None
        record = self.state.read(p.EXIT, self.cfg.restart_count)
        asked = self.suspected_nodes(diagnose(log, self.cfg.launcher, record), watch, log)
        return self.start_asking(asked) if asked else None

    def ask_nodes(self, failure: Diagnosis | None, watch: Watch, log: str,
                  early: NodeAnswers | None = None) -> tuple[str, ...]:
        """A failed step whose ranks died without a word while the others only lost their
        peers (:func:`hpctrain.supervisor.lost.suspects`): ask each node where they died
        for a step before calling it a crash (``early``: the same nodes asked already).
        The nodes that did not answer (lost, noted bad)."""
        asked = self.suspected_nodes(failure, watch, log)
        if not asked:
            return ()
        probe = early if early is not None and early.nodes == asked else \
            self.start_asking(asked)
        lost = {}
        for node, why in probe.answers().items():
            if why is None:
                say(f"node {node} answered: the step failed on its own")
            else:
                say(f"node {node} did not answer a step launched there ({why}): lost, "
                    "not a crash")
                lost[node] = "node_fail"
        self.bad.note(lost)
        return tuple(lost)

    def suspected_nodes(self, failure: Diagnosis | None, watch: Watch, log: str) -> tuple[str, ...]:
        """The step's nodes to ask before ``failure`` is called a crash (:func:`suspects`)."""
        return suspects(failure, watch.records(), log,
                        self.on or hostlist.expand(self.cfg.nodelist))

    def start_asking(self, nodes: tuple[str, ...]) -> NodeAnswers:
        """Start asking ``nodes`` for a step, and say so in the job log when it starts."""
        say(f"rank(s) on {','.join(nodes)} died without a word and no rank failed of its "
            "own: asking the node(s) for a step before calling it a crash")
        return self.slurm.probe_nodes(list(nodes), PROBE_S)

    def failed_attempt(self) -> Facts:
        """The facts of an attempt that failed while its processes live on (they wait for
        the word: hpctrain.runtime.run): a failed step, as far as the table is concerned,
        its crash record (a hang: the watchdog's word) and the allocation's state."""
        cfg = self.cfg
        view = self.ask()
        record = self.state.read(p.EXIT, cfg.restart_count)
        ledger = self.state.ledger()
        # (the same processes on the same nodes: a spare cannot stand in for a bad one)
        return self.facts(view, 1, record=record, restarts=ledger.restarts,
                          inplace=self.allocation(view, ledger.step_restarts, spares=False),
                          failure=diagnose("", cfg.launcher, record), wrapped=True,
                          crashes=ledger.crashes)

    def allocation(self, view: JobView | None, used: int, spares: bool = True) -> InPlace:
        """The facts an in-place restart is judged by: ranks that froze in the hang (their
        nodes are bad), else the nodes Slurm calls unhealthy, the time left, and with spare
        nodes how many good ones the allocation keeps."""
        cfg, hang = self.cfg, self.hang
        frozen = hang.frozen_nodes if hang is not None else ()
        self.bad.note({node: "hang" for node in frozen})
        left = view.end_time - self.slurm.time() if view and view.end_time else None
        unhealthy = {} if frozen else {**{n: "answering no step" for n in self.unanswered},
                                       **self.bad.check(view)}
        healthy = None
        if cfg.spare_nodes and spares:
            healthy = len([n for n in self.allocated(view) if n not in self.bad.found])
        batch = cfg.batch_node if cfg.batch_node in self.unanswered else ""
        return InPlace(cfg.max_step_restarts, used, frozen, unhealthy, left, cfg.signal_lead_s,
                       healthy, cfg.nodes, batch)

    # ---- spare nodes ([elastic]) -------------------------------------------------------------
    def allocated(self, view: JobView | None) -> list[str]:
        """The job's nodes now: a lost one was taken from it (:mod:`.spares`)."""
        return hostlist.expand(view.node_list if view is not None and view.node_list
                               else self.cfg.nodelist)

    def place(self, view: JobView | None) -> list[str] | None:
        """The nodes the next step runs on (the batch node first, bad ones left out); None
        when too few good ones are left."""
        cfg = self.cfg
        self.on = step_nodes(self.allocated(view), list(self.bad.found), cfg.batch_node,
                             cfg.nodes) or []
        self.lost = ()
        return self.on or None

    def lost_nodes(self, view: JobView | None) -> tuple[str, ...]:
        """The step's nodes lost, once it ended: those that answered no step at its end
        (:meth:`ask_nodes`); with spare nodes also those found silent while it ran, no
        longer in the job, or marked down by Slurm (without spares Slurm requeues a job
        whose node it marks down)."""
        if not self.cfg.spare_nodes:
            return self.unanswered
        now = set(self.allocated(view))
        gone = [n for n in self.on if n not in now or self.bad.found.get(n) == "node_fail"]
        self.bad.note({n: "node_fail" for n in gone if n not in self.bad.found})
        return tuple(dict.fromkeys((*self.lost, *self.unanswered, *gone)))
