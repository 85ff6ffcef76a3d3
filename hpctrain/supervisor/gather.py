"""The raw facts of one run, as the supervisor gathers them for the decisions: Slurm's view
of the job (retried while the controller does not answer), the stop signals the batch step
caught (:class:`~hpctrain.supervisor.runstate.RunState`), the ranks' records in the state
directory, the first failure in the job log, the allocation's nodes and the clock. It reads
and waits; it never acts: asking nodes for a step and noting bad ones are the actors'
(:mod:`hpctrain.supervisor.nodes`), and nothing here decides
(:mod:`hpctrain.supervisor.decision`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpctrain import hostlist
from hpctrain.protocol.records import ExitRecord
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import CAUSE_OF_RUN_STATE, Facts, InPlace, slurm_event
from hpctrain.supervisor.diagnosis import Diagnosis, diagnose, memory_kill
from hpctrain.supervisor.hang import FINISH_WAIT_S, Watch
from hpctrain.supervisor.rendezvous import Rendezvous
from hpctrain.supervisor.runstate import RunState
from hpctrain.supervisor.scheduler import Scheduler, answered
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.waits import Waiter

POLL_S = 0.1                 # how often the step and the signal log are looked at
QUIET_S = 3.0                # a failed step Slurm has no word on yet: wait this long for one
ASK_DEADLINE_S = 60.0        # keep asking an unreachable controller this long for the verdict
# slurmdbd records a requeued run's end a moment after the requeue; the wait stays well
# inside KillWait (30 s by default), the batch step's time to live once Slurm requeued it
SACCT_WAIT_S = 5.0
SACCT_POLL_S = 0.5


@dataclass(frozen=True)
class EndNodes:
    """What a failed step's end found of its nodes, for the facts of the decision."""

    unhealthy: Mapping[str, str] = field(default_factory=dict)  # node -> why (Slurm's state,
    #                                                   "answering no step", a fault left out)
    lost: tuple[str, ...] = ()       # lost: silent, answering no step, gone from the job
    faulty: tuple[str, ...] = ()     # their ranks died without a word, the node answering
    slow: tuple[str, ...] = ()       # taken out for slowness ([health] on_slow = replace)


class Gather:
    """The facts of one run for each decision, read from Slurm, the state directory, the
    job log and the run's state (never written here)."""

    def __init__(self, cfg: Config, slurm: Scheduler, state: StateDir, run: RunState) -> None:
        self.cfg, self.slurm, self.state, self.run = cfg, slurm, state, run
        self.rendezvous = Rendezvous(cfg.master_addr, cfg.master_port, cfg.batch_node)

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
        cfg, run = self.cfg, self.run
        return Facts(restart_count=cfg.restart_count, requeue_signal=cfg.requeue_signal,
                     budget=cfg.budget, requeues=run.requeues, view=view,
                     now=self.slurm.time(), status=status, caught=tuple(run.caught),
                     hang=run.hang.text() if run.hang else None,
                     hang_phase=run.hang.phase if run.hang else "", **more)

    def record(self) -> ExitRecord | None:
        """This run's exit record (the runtime's crash or requeue record), None when none."""
        return self.state.exit_record(self.cfg.restart_count)

    def failure(self, log: str) -> Diagnosis | None:
        """The first failure of the step, from its log and the exit record."""
        return diagnose(log, self.cfg.launcher, self.record())

    def words_in(self, watch: Watch) -> None:
        """A moment for a rank's "exited", which may still be on its way beside its exit."""
        Waiter(self.slurm).until(lambda: not watch.exiting(), FINISH_WAIT_S, 0.05)

    def at_end(self, status: int, watch: Watch, log: str, view: JobView | None,
               failure: Diagnosis | None, nodes: EndNodes) -> Facts:
        """The facts once the step has ended (``log``: this run's part of the job log;
        ``failure``: its first failure; ``nodes``: what its end found of its nodes,
        :meth:`hpctrain.supervisor.nodeloss.NodeLoss.at_end`)."""
        cfg, state = self.cfg, self.state
        run_state = notice = None
        if slurm_event(view, cfg.restart_count) == "requeued":
            run_state = self.end_state()
            stop = state.stop_notice(cfg.restart_count)
            notice = stop.cause if stop is not None else None
        ledger = state.ledger()
        inplace = self.allocation(view, ledger.step_restarts, nodes.unhealthy) if status \
            else InPlace()
        return self.facts(view, status, record=self.record(), run_state=run_state,
                          notice=notice, restarts=ledger.restarts, inplace=inplace,
                          lost=nodes.lost, faulty=nodes.faulty, slow=nodes.slow,
                          finish=watch.finish(), failure=failure if status else None,
                          memory=memory_kill(log) if status else None,
                          port=self.rendezvous.moved(log) if status else None,
                          wrapped=watch.wrapped(), crashes=ledger.crashes,
                          shrunk_failed=self.shrunk_failed(status, watch))

    def shrunk_failed(self, status: int, watch: Watch) -> str:
        """A shrunk step ([elastic] min_nodes) that failed before any rank finished a step
        in it: its GPUs now and at full width ("2 of 4"); "" otherwise. The script may not
        be able to run shrunk (a state sharded across its data-parallel ranks): the
        decision requeues at full size rather than call it the script's crash."""
        cfg = self.cfg
        width = len(self.run.on) if cfg.elastic and self.run.on else cfg.nodes
        if not status or width >= cfg.nodes or \
                any(r.boundaries for r in watch.records().values()):
            return ""
        return f"{width * cfg.world // cfg.nodes} of {cfg.world}"

    def end_state(self) -> str | None:
        """sacct's end state of this run, which Slurm requeued (``NODE_FAIL``, ...); asked
        again for SACCT_WAIT_S while slurmdbd has not recorded the end yet (sacct still
        says RUNNING), None if it still has not. (A run that gave a node back ends in a
        RESIZING row when requeued: sacct says no more of it.)"""
        n, found = self.cfg.restart_count, [None]

        def recorded() -> bool:
            states = self.slurm.run_states(self.cfg.key)
            found[0] = states[n] if len(states) > n else None
            return found[0] in CAUSE_OF_RUN_STATE or found[0] == "RESIZING"

        Waiter(self.slurm).until(recorded, SACCT_WAIT_S, SACCT_POLL_S)
        return found[0]

    def failed_attempt(self, view: JobView | None, unhealthy: Mapping[str, str]) -> Facts:
        """The facts of an attempt that failed while its processes live on (they wait for
        the word: hpctrain.runtime.run): a failed step, as far as the table is concerned,
        its crash record (a hang: the watchdog's word) and the allocation's state."""
        record = self.record()
        ledger = self.state.ledger()
        # (the same processes on the same nodes: a spare cannot stand in for a bad one)
        return self.facts(view, 1, record=record, restarts=ledger.restarts,
                          inplace=self.allocation(view, ledger.step_restarts, unhealthy,
                                                  spares=False),
                          failure=diagnose("", self.cfg.launcher, record), wrapped=True,
                          crashes=ledger.crashes)

    def allocation(self, view: JobView | None, used: int, unhealthy: Mapping[str, str],
                   spares: bool = True) -> InPlace:
        """The facts an in-place restart is judged by: ranks that froze in the hang, else
        the nodes found unhealthy (``unhealthy``, and those that answered no step), the
        time left, and with spare nodes how many good ones the allocation keeps."""
        cfg, run = self.cfg, self.run
        frozen = run.hang.frozen_nodes if run.hang is not None else ()
        left = view.end_time - self.slurm.time() if view and view.end_time else None
        bad = {} if frozen else {**{n: "answering no step" for n in run.unanswered},
                                 **unhealthy}
        healthy = None
        if cfg.elastic and spares:
            healthy = len([n for n in self.allocated(view) if n not in self.run_bad])
        batch = cfg.batch_node if cfg.batch_node in run.unanswered else ""
        fault = cfg.batch_node if run.bad.get(cfg.batch_node) == "node_fault" else ""
        # its ranks froze in a hang, it failed the health check: placed without it, the
        # step would have no rendezvous (an adversarial run's frozen batch node, shrunk)
        why = run.bad.get(cfg.batch_node) if healthy is not None else None
        return InPlace(cfg.max_step_restarts, used, frozen, bad, left, cfg.signal_lead_s,
                       healthy, cfg.nodes, batch, fault, fewest=cfg.widths[-1],
                       batch_bad=f"{cfg.batch_node} ({why})" if why and not fault else "")

    # ---- the allocation's nodes ----------------------------------------------------------------
    @property
    def run_bad(self) -> Mapping[str, str]:
        """The nodes the actors noted bad in this run (:class:`~.nodes.BadNodes`)."""
        return self.run.bad

    def allocated(self, view: JobView | None) -> list[str]:
        """The job's nodes now: a lost one was taken from it (:mod:`.spares`)."""
        return hostlist.expand(view.node_list if view is not None and view.node_list
                               else self.cfg.nodelist)
