"""One run of a job under the supervisor: claim the state, account for the runs before
(:mod:`hpctrain.supervisor.history`), start the step (:mod:`hpctrain.supervisor.step`),
pass stop signals on and watch it for hangs (:mod:`hpctrain.supervisor.hang`), then
decide from Slurm's facts (:mod:`hpctrain.supervisor.decision`) and act: finish, requeue
(without the bad nodes, :mod:`hpctrain.supervisor.nodes`), or start the step again in
this allocation.

The rendered script ends with ``exec python -m hpctrain.supervisor -- <launcher argv>``,
so this process *is* the batch step: Slurm's signals to the batch shell come here. Until
its handlers are installed the script ignores them (an ignored signal survives exec, a
trapped one would not), and whatever may have been missed is asked of Slurm at start.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

from hpctrain import protocol as p
from hpctrain.errors import HpctrainError, SlurmError
from hpctrain.protocol.ledger import line
from hpctrain.slurm import control
from hpctrain.slurm.view import JobView
from hpctrain.supervisor import container
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import (CAUSE_OF_RUN_STATE, Caught, Decision, Facts,
                                          InPlace, decide, notice_cause, runtime_word,
                                          slurm_event, warning_due)
from hpctrain.supervisor.diagnosis import Diagnosis, diagnose, log_segment, log_size
from hpctrain.supervisor.finish import Finish
from hpctrain.supervisor.hang import Watch
from hpctrain.supervisor.history import account_restarts
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.nodes import BadNodes
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.step import Step, forward, step_env
from hpctrain.supervisor.watchdog import Hang

POLL_S = 0.1                 # how often the step and the signal log are looked at
SETTLE_S = 3.0               # a failed step Slurm has no word on yet: wait this long for one
ASK_DEADLINE_S = 60.0        # keep asking an unreachable controller this long for the verdict
REQUEUE_DEADLINE_S = 300.0   # ...and this long to requeue (a controller failover)
RETRY_S = 2.0
T = TypeVar("T")


class Supervisor:
    """Owns one run of the batch step: see the module docstring."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.caught: list[Caught] = list(cfg.early)
        self._pending: list[Caught] = []        # appended to by the signal handler only
        self._forwarded = False
        self._acted: Decision | None = None     # a requeue made before the step ended
        self._requeues: dict[str, int] = {}     # the ledger's counts by cause, at start
        self.bad = BadNodes(cfg.key, os.environ.get("SLURM_JOB_NODELIST", ""),
                            cfg.exclude_bad_nodes,  # excluded when the job is requeued
                            max(cfg.nodes, _int_env("SLURM_JOB_NUM_NODES")))
        self._hang: Hang | None = None          # what the watchdog found in this attempt

    # ---- signals -------------------------------------------------------------------------
    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # record only: no I/O and no locks inside a handler
        self._pending.append(Caught(signal.Signals(signum).name[3:], time.time()))

    def install(self) -> None:
        for name in dict.fromkeys((self.cfg.requeue_signal, "TERM", "INT")):
            signal.signal(signal.Signals["SIG" + name], self._handler)

    def take_signals(self) -> list[Caught]:
        new = self._pending[:]
        del self._pending[:len(new)]
        self.caught += new
        return new

    # ---- asking Slurm ----------------------------------------------------------------------
    def ask(self, deadline_s: float = 0.0) -> JobView | None:
        """Slurm's view of this job; None when it cannot be asked (after ``deadline_s`` of
        retries) or no longer knows the job."""
        what = f"scontrol show job {self.cfg.key}"
        done, view = until_answered(lambda: control.show_job(self.cfg.key), what, deadline_s)
        return view if done else None

    # ---- the run ---------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        self.install()
        state, note = StateDir.claim(cfg.base, cfg.key, cfg.restart_count, cfg.cluster,
                                     cfg.submission)
        if note:
            say(note)
        view = self.ask()
        last_cause, stop, self._requeues = account_restarts(cfg, state)
        state.clear(p.STOP, p.EXIT)   # earlier runs' notices and records have been read
        if stop is not None:
            return self.act(stop, state, None)
        self.take_signals()
        if cfg.requeue_signal not in {c.name for c in self.caught} and \
                warning_due(view, cfg.signal_lead_s, time.time()):
            say(f"the time-limit warning is due (signal_lead_s={cfg.signal_lead_s} before the "
                "job's end, by Slurm's clock): taking it as received")
            self.caught.append(Caught(cfg.requeue_signal, time.time(), early=True))
        started = view is None or slurm_event(view, cfg.restart_count) == "running"
        if self.caught or not started:
            # a stop came before the step started: during setup, or a preemption
            return self.act(decide(self.facts(view, None)), state, self.facts(view, None))
        return self.run_step(state, view, last_cause)

    def run_step(self, state: StateDir, view: JobView | None, last_cause: str | None) -> int:
        """Start the training step and see it to its end, restarting it in this allocation
        while the decision table says so; the batch step's exit code."""
        cfg = self.cfg
        logfile = view.std_err if view is not None else ""
        logs = (logfile, view.std_out if view is not None else "")
        argv, notes = container.step_argv(cfg.argv, cfg.container, state.path, cfg.submit_dir)
        for note in notes:
            say(note)
        attempt = 0
        while True:
            if cfg.health_check:
                failed = self.bad.run_check(cfg.health_check, cfg.nodes,
                                            cfg.health_check_timeout_s)
                if failed:
                    return self.leave_bad_nodes(state, view, failed)
            offset = log_size(logfile) if logfile else 0
            after = f", after a {last_cause}" if last_cause else ""
            again = f", in-place restart {attempt}" if attempt else ""
            say(f"starting the training step of job {cfg.key}: {cfg.where}, "
                f"restart {cfg.restart_count}{again}{after}")
            step = Step(argv, step_env(cfg, state, view, last_cause, attempt))
            watch = Watch(state, cfg.limits, cfg.world, cfg.restart_count, attempt, logs,
                          cfg.nodes)
            status, self._hang = self.supervise(step, state, watch)
            say(f"training step exited with status {status}")
            facts = self.gather(state, status, watch, log_segment(logfile, offset)
                                if status and logfile else "")
            if self._acted is not None:
                return self._acted.exit_code
            decision = decide(facts)
            # the first failure, where the verdict is about one: a crash, or a rank that
            # died at exit after the work was done (row 6)
            failed = decision.cause in ("user_crash", "unknown") or \
                (decision.cause == "completed" and bool(decision.detail))
            diagnosis = facts.failure if failed else None
            if decision.action != "restart":
                return self.act(decision, state, facts, diagnosis)
            attempt += 1
            last_cause = decision.cause
            self.restart_in_place(decision, state, facts, attempt, diagnosis)

    def supervise(self, step: Step, state: StateDir, watch: Watch) -> tuple[int, Hang | None]:
        """Wait for the step, passing stop signals on and watching for a hang; (its exit
        status, the hang that made the supervisor kill it or None)."""
        self._forwarded = False
        while True:
            status = step.poll()
            for caught in self.take_signals():
                self.on_stop(caught, step, state)
            if status is not None:
                return status, None
            # once a stop was passed on, the ranks save and leave: Slurm's grace bounds that
            hang = None if self._forwarded else watch.look()
            if hang is not None:
                status, hang = watch.handle(hang, step, self.cfg.key)
                return status, hang
            time.sleep(POLL_S)

    def on_stop(self, caught: Caught, step: Step, state: StateDir) -> None:
        """A stop signal while the step runs: tell the ranks why (the stop notice), then
        pass a stop on, once. When Slurm has already ended the run for its time limit,
        requeue at once: KillWait may not outlast the ranks' emergency save."""
        cfg = self.cfg
        view = self.ask()
        event = slurm_event(view, cfg.restart_count)
        cause = notice_cause(caught.name, view, cfg.requeue_signal)
        if cause is not None:
            state.write(p.STOP, {"cause": cause, "restart_count": cfg.restart_count,
                                 "signal": caught.name})
        if event == "time_limit" and self._acted is None:
            facts = self.facts(view, None)
            decision = decide(facts)
            if decision.action == "requeue":
                self.act(decision, state, facts)
                self._acted = decision
        if event == "requeued":
            # a node failure: the lost node is DOWN now; note it before anyone returns it
            self.bad.check(view)
        if event in ("requeued", "ended", "time_limit") or self._forwarded:
            say(f"caught SIG{caught.name} ({cause or event}); Slurm is ending the step itself"
                if not self._forwarded else f"caught SIG{caught.name} ({cause or event})")
            return
        sig = "TERM" if caught.name in ("TERM", "INT") else cfg.step_signal
        how = forward(cfg.key, sig, step)
        self._forwarded = True
        say(f"caught SIG{caught.name} ({cause or 'no preemption or time limit'}); "
            f"asking the training step to stop: {how}")

    # ---- facts -----------------------------------------------------------------------------
    def facts(self, view: JobView | None, status: int | None,
              record: dict[str, str] | None = None, requeued_as: str | None = None,
              state: StateDir | None = None, finish: Finish | None = None,
              failure: Diagnosis | None = None) -> Facts:
        cfg = self.cfg
        hang = self._hang
        ledger = state.ledger() if state is not None else None
        restarts = ledger.restarts if ledger is not None else {}
        inplace = InPlace()
        if ledger is not None and status not in (None, 0):
            inplace = InPlace(cfg.max_step_restarts, ledger.step_restarts,
                              self.bad.obstacle(view, hang, cfg.signal_lead_s))
        return Facts(restart_count=cfg.restart_count, requeue_signal=cfg.requeue_signal,
                     budget=cfg.budget, requeues=self._requeues, view=view, now=time.time(),
                     status=status, caught=tuple(self.caught), record=record or {},
                     requeued_as=requeued_as, hang=hang.text() if hang else None,
                     hang_phase=hang.phase if hang else "", restarts=restarts,
                     inplace=inplace, finish=finish, failure=failure)

    def gather(self, state: StateDir, status: int, watch: Watch, log: str) -> Facts:
        """The facts once the step has ended (``log``: this run's part of the job log, for
        the first failure). A failure Slurm has no word on yet (say, a node it has not
        noticed losing) gets SETTLE_S for Slurm to speak."""
        cfg = self.cfg
        view = self.ask(ASK_DEADLINE_S)
        # (a hang's step was killed by the supervisor itself: nothing for Slurm to add)
        if status != 0 and not self.caught and self._hang is None and \
                slurm_event(view, cfg.restart_count) == "running":
            end = time.monotonic() + SETTLE_S
            while time.monotonic() < end and not self.take_signals():
                time.sleep(POLL_S)
            view = self.ask(ASK_DEADLINE_S)
        record = state.read(p.EXIT, cfg.restart_count)
        requeued_as = None
        if slurm_event(view, cfg.restart_count) == "requeued":
            # a specific end state from sacct, else this run's own word
            states = control.run_states(cfg.key)
            seen = CAUSE_OF_RUN_STATE.get(states[cfg.restart_count]) \
                if len(states) > cfg.restart_count else None
            notice = state.read(p.STOP, cfg.restart_count).get("cause")
            requeued_as = (seen if seen not in (None, "requeued") else None) or notice \
                or runtime_word(record, status) or seen
            if requeued_as == "node_fail":
                self.bad.check(view)
        failure = diagnose(log, cfg.launcher, record) if status else None
        return self.facts(view, status, record, requeued_as, state, watch.finish(), failure)

    # ---- in-place restarts and bad nodes -------------------------------------------------
    def restart_in_place(self, d: Decision, state: StateDir, facts: Facts, attempt: int,
                         diagnosis: Diagnosis | None) -> None:
        """Record an in-place restart and clear the attempt's records for the next one."""
        cfg = self.cfg
        failure = f"; first failure: {diagnosis.text()}" if diagnosis is not None else ""
        say(f"restarting the training step in this allocation after a {d.cause} "
            f"({d.detail}): {d.why}{failure}")
        state.append_ledger(line("restart", cause=d.cause, restart_count=cfg.restart_count,
                                 attempt=attempt, at=f"{time.time():.1f}", **self.hang_fields()))
        state.write(p.OUTCOME, {"cause": d.cause, "action": "restart",
                                "restart_count": cfg.restart_count, "attempt": attempt,
                                "job": cfg.key, "status": facts.status or "",
                                "step": facts.record.get("step", ""), "why": d.why,
                                "at": f"{time.time():.0f}"})
        state.clear(p.EXIT, p.STOP, p.DUMP)

    def leave_bad_nodes(self, state: StateDir, view: JobView | None,
                        failed: dict[str, str]) -> int:
        """The partition's health check failed on ``failed``: requeue the job without them,
        not counted against its requeue budget; when it cannot be kept off them (no room
        in the partition, exclusion turned off), end it and say why."""
        cfg = self.cfg
        nodes = ",".join(failed)
        why = f"the partition's health check failed on {nodes}"
        leave_out = self.bad.to_exclude(view)
        if leave_out and view is not None and self.requeue():
            state.append_ledger(line("requeue", cause="health_check",
                                     restart_count=cfg.restart_count + 1, by="supervisor"))
            say(f"requeued job {cfg.key} ({why}); not counted against max_requeues")
            state.write(p.OUTCOME, {"cause": "health_check", "action": "requeue",
                                    "restart_count": cfg.restart_count, "job": cfg.key,
                                    "node": nodes, "why": why, "at": f"{time.time():.0f}"})
            self.bad.exclude(state, view, leave_out, cfg.restart_count)
            return 0
        return self.act(Decision("finish", "health_check", 1,
                                 f"{why}, and the job cannot be kept off it (the partition has "
                                 "no other node for it, or watchdog.exclude_bad_nodes is off): "
                                 "ask the site to drain the node"), state, None)

    def hang_fields(self) -> dict[str, str]:
        """What the watchdog found, for the ledger line of the restart or requeue."""
        hang = self._hang
        if hang is None:
            return {}
        return {"detected_at": f"{hang.detected_at:.1f}", "idle_s": f"{hang.idle_s:.1f}",
                "phase": hang.phase, "ranks": ",".join(map(str, hang.ranks)) or "-"}

    # ---- acting ------------------------------------------------------------------------------
    def act(self, d: Decision, state: StateDir, facts: Facts | None,
            diagnosis: Diagnosis | None = None) -> int:
        """Record the verdict, do what it says, return the batch step's exit code.
        ``facts`` is None for a stop decided at start (already said why)."""
        cfg = self.cfg
        record = facts.record if facts is not None else {}
        status = facts.status if facts is not None else None
        verdict: dict[str, object] = {
            "cause": d.cause, "action": d.action, "restart_count": cfg.restart_count,
            "job": cfg.key, "status": "" if status is None else status,
            "step": record.get("step", ""), "limit": d.limit or "", "why": d.why,
            "detail": d.detail, "at": f"{time.time():.0f}"}
        if diagnosis is not None:
            verdict.update(rank="" if diagnosis.rank is None else diagnosis.rank,
                           node=diagnosis.node or "", error=diagnosis.error or "",
                           failure=diagnosis.text())
        state.write(p.OUTCOME, verdict)
        if d.action == "requeue":
            say(f"requeueing job {cfg.key} after a {d.cause} ({d.detail}): {d.why}")
            view = facts.view if facts is not None else None
            leave_out = self.bad.to_exclude(view)   # asked before the requeue's SIGTERM
            if not self.requeue():
                state.write(p.OUTCOME, {**verdict, "action": "requeue_failed"})
                return 1
            state.append_ledger(line("requeue", cause=d.cause,
                                     restart_count=cfg.restart_count + 1, by="supervisor",
                                     **self.hang_fields()))
            if leave_out and view is not None:
                self.bad.exclude(state, view, leave_out, cfg.restart_count)
        elif d.action == "stop":
            if facts is not None:
                say(f"not requeueing job {cfg.key} after a {d.cause}: {d.detail}")
            state.append_ledger(line("stop", cause=d.cause, restart_count=cfg.restart_count,
                                     limit=d.limit))
            self.forbid_requeue()
        elif d.action == "leave":
            say(f"job {cfg.key} was requeued by Slurm ({d.cause}); the next run goes on")
            state.append_ledger(line("requeue", cause=d.cause,
                                     restart_count=cfg.restart_count + 1, by="slurm"))
            view = facts.view if facts is not None else None
            leave_out = self.bad.to_exclude(view)
            if leave_out and view is not None:
                self.bad.exclude(state, view, leave_out, cfg.restart_count)
        elif d.cause == "completed":
            say(f"job {cfg.key} completed" + (f": {d.why}" if d.detail else ""))
        else:
            detail = f"; first failure: {diagnosis.text()}" if diagnosis is not None else ""
            say(f"job {cfg.key} ends: {d.cause} ({d.why}){detail}")
        return d.exit_code

    def requeue(self) -> bool:
        """``scontrol requeue``, retried while the controller is unreachable."""
        key = self.cfg.key
        done, how = until_answered(lambda: control.requeue(key), f"scontrol requeue {key}",
                                   REQUEUE_DEADLINE_S)
        if how == "already":
            say(f"job {key} was already requeued")
        return done

    def forbid_requeue(self) -> None:
        """A limit ended the job: PreemptMode=REQUEUE must not requeue it anyway."""
        try:
            control.forbid_requeue(self.cfg.key)
        except SlurmError as exc:
            say(f"could not clear job {self.cfg.key}'s Requeue flag: {exc}")


def _int_env(name: str) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw.isdigit() else 0


def until_answered(call: Callable[[], T], what: str, deadline_s: float) -> tuple[bool, T | None]:
    """``(True, call())``, retrying for up to ``deadline_s`` while the controller does not
    answer (a failover, a restart); ``(False, None)`` once it gives up or Slurm refuses."""
    end = time.monotonic() + deadline_s
    told = False
    while True:
        try:
            return True, call()
        except SlurmError as exc:
            if time.monotonic() >= end or not control.is_unreachable(exc):
                say(f"{what} failed: {exc}")
                return False, None
            if not told:
                say(f"{what}: the controller does not answer ({exc}); trying again for up "
                    f"to {deadline_s:.0f} s")
                told = True
            time.sleep(RETRY_S)


def main(argv: list[str] | None = None) -> int:
    """``python -m hpctrain.supervisor -- LAUNCHER ...`` (the rendered script's last line)."""
    try:
        cfg = Config.from_env(sys.argv[1:] if argv is None else argv, os.environ)
        return Supervisor(cfg).run()
    except HpctrainError as exc:
        say(f"error: {exc}")
        return exc.exit_code
