"""Doing what a decision says: requeue (and keep the job off its bad nodes), stop at a
limit, leave a requeue to Slurm, finish, restart the step in place, pass a stop on to the
ranks. Every verdict and ledger line goes through the one
:class:`~hpctrain.supervisor.recorder.Recorder`; Slurm through the
:class:`~hpctrain.supervisor.scheduler.Scheduler`.
"""

from __future__ import annotations

import os

from hpctrain import protocol as p
from hpctrain.errors import SlurmError
from hpctrain.protocol.dialog import Attempt, Resume
from hpctrain.slurm.view import JobView
from hpctrain.supervisor import caches
from hpctrain.supervisor.board import Board
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import Decision, Facts, crash_signature
from hpctrain.supervisor.diagnosis import Diagnosis
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.nodes import BadNodes
from hpctrain.supervisor.recorder import Recorder
from hpctrain.supervisor.runstate import RunState
from hpctrain.supervisor.scheduler import Scheduler, StepProcess, answered
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.watchdog import Hang

REQUEUE_DEADLINE_S = 300.0   # keep asking an unreachable controller to requeue (failover)


def run_step(facts: Facts) -> int | None:
    """The step the runtime's exit record says the run reached, for the verdict."""
    return facts.record.step if facts.record is not None else None


def crash_of(d: Decision, facts: Facts | None) -> str | None:
    """The signature of the crash ``d`` recovers from, for its ledger line; None else."""
    return crash_signature(facts.record) if d.cause == "user_crash" and facts else None


class Actor:
    """Acts on one run's decisions."""

    def __init__(self, cfg: Config, slurm: Scheduler, state: StateDir, run: RunState,
                 board: Board) -> None:
        self.cfg, self.slurm, self.state, self.board = cfg, slurm, state, board
        self.run = run
        self.books = Recorder(state, cfg.key, cfg.restart_count, slurm.time)
        # excluded when the job is requeued; it needs what it started with, never fewer
        self.bad = BadNodes(slurm, cfg.key, cfg.nodelist, cfg.exclude_bad_nodes,
                            max(cfg.nodes, cfg.job_nodes), found=run.bad)

    def tidy(self) -> None:
        """The run is over: where its verdict ended the job for good, the job's cache
        directory goes (a requeued job keeps it; :mod:`hpctrain.supervisor.caches`)."""
        verdict = self.state.verdict(self.cfg.restart_count)
        if note := caches.drop(os.environ, verdict.action if verdict is not None else ""):
            say(note)

    def act(self, d: Decision, facts: Facts | None, diagnosis: Diagnosis | None = None,
            leave_out: dict[str, str] | None = None, hang: Hang | None = None,
            **extra: object) -> int:
        """Record the verdict, do what it says, return the batch step's exit code.
        ``facts`` is None for a stop decided at start (already said why); ``leave_out``:
        the bad nodes to exclude, when already asked; ``hang``: what the watchdog found."""
        cfg = self.cfg
        view = facts.view if facts is not None else None
        step = facts.record.step if facts is not None and facts.record is not None else None
        status = facts.status if facts is not None else None
        self.books.verdict(d, status=status, step=step, diagnosis=diagnosis, **extra)
        if d.action == "requeue":
            say(f"requeueing job {cfg.key} after a {d.cause} ({d.detail}): {d.why}")
            # asked before the requeue's SIGTERM
            leave_out = self.bad.to_exclude(view) if leave_out is None else leave_out
            if not self.requeue():
                self.books.verdict(d, action="requeue_failed", status=status, step=step,
                                   diagnosis=diagnosis, **extra)
                return 1
            self.books.requeued(d.cause, cfg.restart_count + 1, "supervisor", hang,
                                crash=crash_of(d, facts))
            self.exclude(view, leave_out)
            self.regrow()
        elif d.action == "stop":
            if facts is not None:
                say(f"not requeueing job {cfg.key} after a {d.cause}: {d.detail}")
            self.books.stopped(d.cause, d.limit)
            self.forbid_requeue()
        elif d.action == "leave":
            say(f"job {cfg.key} was requeued by Slurm ({d.cause}); the next run goes on")
            self.books.requeued(d.cause, cfg.restart_count + 1, "slurm")
            if d.cause == "node_fail":
                self.bad.check(view)   # the lost node, noted before anyone returns it
            self.exclude(view, self.bad.to_exclude(view))
            self.regrow()
        elif d.cause == "completed":
            say(f"job {cfg.key} completed" + (f": {d.why}" if d.detail else ""))
        else:
            detail = f"; first failure: {diagnosis.text()}" if diagnosis is not None else ""
            say(f"job {cfg.key} ends: {d.cause} ({d.why}){detail}")
        return d.exit_code

    def restart_in_place(self, d: Decision, facts: Facts, attempt: int,
                         diagnosis: Diagnosis | None, hang: Hang | None) -> None:
        """Record an in-place restart and clear the attempt's records for the next one."""
        failure = f"; first failure: {diagnosis.text()}" if diagnosis is not None else ""
        say(f"restarting the training step in this allocation after a {d.cause} "
            f"({d.detail}): {d.why}{failure}")
        self.books.restarted(d.cause, attempt, hang, crash=crash_of(d, facts))
        self.books.verdict(d, status=facts.status, step=run_step(facts),
                           attempt=attempt)
        self.state.clear(p.EXIT, p.STOP)
        self.board.clear(p.DUMP)

    def resume(self, d: Decision, facts: Facts, attempt: int, hang: Hang | None) -> None:
        """Restart in the running processes (hpctrain.runtime.run): the ledger's restart
        line and the verdict, the attempt's records cleared, then ``go`` to every rank."""
        say(f"restarting the training step in its processes after a {d.cause} "
            f"({d.detail}): {d.why}")
        self.books.restarted(d.cause, attempt, hang, mode="inprocess",
                             crash=crash_of(d, facts))
        self.books.verdict(d, status=facts.status, step=run_step(facts),
                           attempt=attempt, mode="inprocess")
        self.state.clear(p.EXIT, p.STOP)
        self.board.clear(p.DUMP, p.INTERRUPT)
        self.board.ask(Resume(self.address(attempt), "go"))

    def address(self, attempt: int) -> Attempt:
        """Where a request to the ranks of ``attempt`` of this run goes."""
        return Attempt(self.state.run_id or "", self.cfg.restart_count, attempt)

    def regrow(self) -> None:
        """The job requeued after this run gave nodes back (a lost one, a slow one, a
        shrink): Slurm would start the next run at the smaller size; it asks for the full
        one again (the spec's nodes and spares)."""
        full = self.cfg.nodes + self.cfg.spare_nodes
        small = 0 < self.cfg.job_nodes < full     # it started smaller (an earlier resize)
        if not self.run.given_back and not small:
            return
        why = f"this one gave back {','.join(self.run.given_back)}" if self.run.given_back \
            else f"this one started with {self.cfg.job_nodes}"
        try:
            self.slurm.set_nodes(self.cfg.key, full)
        except SlurmError as exc:
            say(f"could not ask Slurm for {full} node(s) again ({exc}): the next run may "
                f"start with fewer ({why})")
            return
        say(f"the next run asks Slurm for {full} node(s) again ({why})")

    def exclude(self, view: JobView | None, nodes: dict[str, str]) -> None:
        if nodes and view is not None:
            self.bad.exclude(self.books, view, nodes)

    def forward(self, signal_name: str, step: StepProcess) -> str:
        """Ask every rank of the step to stop with ``signal_name``; how it was delivered.
        Through Slurm (``scancel --signal``: every node, not the batch step), not the local
        srun, which would turn a TERM into a kill of the whole step after KillWait; the
        local launcher only when Slurm cannot be asked."""
        try:
            self.slurm.signal_steps(self.cfg.key, signal_name)
            return f"SIG{signal_name} to every rank (scancel --signal)"
        except SlurmError as exc:
            step.kill_local(signal_name)
            return f"SIG{signal_name} to the local launcher (Slurm could not deliver it: {exc})"

    def requeue(self) -> bool:
        """``scontrol requeue``, retried while the controller is unreachable."""
        key = self.cfg.key
        done, how = answered(self.slurm, lambda: self.slurm.requeue(key),
                             f"scontrol requeue {key}", REQUEUE_DEADLINE_S)
        if how == "already":
            say(f"job {key} was already requeued")
        return done

    def forbid_requeue(self) -> None:
        """A limit ended the job: PreemptMode=REQUEUE must not requeue it anyway."""
        try:
            self.slurm.forbid_requeue(self.cfg.key)
        except SlurmError as exc:
            say(f"could not clear job {self.cfg.key}'s Requeue flag: {exc}")
