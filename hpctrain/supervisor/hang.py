"""The view of one attempt of the step, watched: the ranks' progress (from the progress
board, :mod:`hpctrain.supervisor.board`; or the job log's growth), judged
(:mod:`hpctrain.supervisor.watchdog`, pure): a hang, ranks that failed in their processes,
ranks gone silent, the ranks' last words. When the channel itself is silent (the ranks
send, nothing arrives: :mod:`hpctrain.supervisor.silence`) it says so once and judges the
ranks it can still read (this node's, from its local disk), else the job log's growth.
It never waits: what the supervisor does about a hang (waiting for stacks and for the
other ranks' failures, culprits, the kill) is :mod:`hpctrain.supervisor.response`, and
every wait is a :mod:`hpctrain.supervisor.waits`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hpctrain import protocol as p
from hpctrain.protocol.dialog import Attempt
from hpctrain.protocol.progress import Progress
from hpctrain.supervisor.board import SUMMARY_S, Board
from hpctrain.supervisor.elastic import silent_nodes
from hpctrain.supervisor.finish import Finish
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.scheduler import Scheduler
from hpctrain.supervisor.silence import Silence
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.watchdog import Hang, Limits, StepClock, assess, gave_up

LOOK_S = 1.0            # how often progress is looked at
FAILED_LOOK_S = 0.5     # how often ranks waiting to restart in-process are looked for
FINISH_WAIT_S = 0.5     # the ranks' last words, sent as the step ended, still arriving


class Watch:
    """One attempt of the step, watched: ``look()`` returns a :class:`Hang` or None."""

    def __init__(self, slurm: Scheduler, state: StateDir, limits: Limits, world: int,
                 restart_count: int, attempt: int, logs: tuple[str, ...],
                 nodes: int, board: Board, silence: Silence | None = None) -> None:
        self.slurm, self.board, self.silence = slurm, board, silence
        self.state, self.limits, self.world, self.nodes = state, limits, world, nodes
        self.restart_count, self.attempt = restart_count, attempt
        self.started_at = slurm.time()
        self.logs = tuple(log for log in dict.fromkeys(logs) if log)
        self._sizes = self._log_sizes()
        self.output_at: float | None = None
        self._next = slurm.monotonic() + LOOK_S
        self._next_failed = 0.0
        self._next_silent = 0.0
        self._next_summary, self._summary = 0.0, ""
        self.clock = StepClock()     # the step time: a hang timeout left out follows it

    def records(self) -> dict[int, Progress]:
        """This attempt's progress records by rank (as the board parsed them; while the
        channel is silent, with those this node's ranks keep on its disk)."""
        this = Attempt(self.state.run_id, self.restart_count, self.attempt)
        got = {rank: record for rank, record in self.board.records().items()
               if record.address == this}
        if self.silence is not None and self.silence.on:
            for rank, record in self.silence.local_records(this).items():
                if rank not in got or record.newer_than(got[rank]):
                    got[rank] = record
        return got

    @property
    def channel_silent(self) -> bool:
        """Do the ranks' datagrams fail to arrive (silence.py): no requests reach them."""
        return self.silence is not None and self.silence.on

    def silent(self, nodes: list[str]) -> tuple[str, ...]:
        """[elastic] At most every LOOK_S: the step's ``nodes`` whose every rank went
        silent (a lost node, :func:`hpctrain.supervisor.elastic.silent_nodes`)."""
        if not nodes or self.slurm.monotonic() < self._next_silent:
            return ()
        self._next_silent = self.slurm.monotonic() + LOOK_S
        return silent_nodes(self.records(), nodes, self.slurm.time(), self.limits.beat_s)

    def failed(self) -> dict[int, Progress]:
        """At most every FAILED_LOOK_S: this attempt's ranks whose attempt failed in their
        process and that wait for the supervisor's word (``hpctrain.runtime.run``), by rank."""
        if self.slurm.monotonic() < self._next_failed:
            return {}
        self._next_failed = self.slurm.monotonic() + FAILED_LOOK_S
        return self.failed_now()

    def inprocess(self) -> bool:
        """Can every rank of this attempt start its next one in its own process?"""
        records = self.records()
        return len(records) == self.world and all(r.inprocess for r in records.values())

    def wrapped(self) -> bool:
        """Does the step's script run under ``hpctrain.runtime.run``? Any rank's record
        says so (whether or not its attempts can restart in its process)."""
        return any(r.wrapped for r in self.records().values())

    def next(self) -> Watch:
        """The watch of the next attempt, in the same step (an in-process restart)."""
        watch = Watch(self.slurm, self.state, self.limits, self.world, self.restart_count,
                      self.attempt + 1, self.logs, self.nodes, self.board, self.silence)
        # the same processes: the same pace, the same pauses
        watch.clock = StepClock(known=self.clock.step_s(), longest_s=self.clock.longest_s)
        return watch

    def summarize(self, final: bool = False) -> None:
        """At most every SUMMARY_S, rank 0's newest record into the state directory's
        ``summary``, when it changed: ``hpctrain status``'s live line, the one file this
        channel writes to shared storage. ``final``: the step has ended: now, so that a
        finished job shows the step it ended at, not one up to SUMMARY_S older."""
        if not final and self.slurm.monotonic() < self._next_summary:
            return
        self._next_summary = self.slurm.monotonic() + SUMMARY_S
        record = self.records().get(0)
        if record is None:
            return
        shown = {k: v for k, v in record.fields().items() if k != "beat_at"}
        text = repr(sorted(shown.items()))
        if text != self._summary:
            try:
                self.state.write(p.SUMMARY, shown)
                self._summary = text
            except (OSError, ValueError):
                pass      # status then shows the previous line; training goes on

    def finish(self) -> Finish:
        """What the ranks said as they left (the decision's row died-at-exit)."""
        return Finish.from_records(self.records(), self.world)

    def exiting(self) -> bool:
        """Is a rank's "exited" still on its way (its "exiting" seen)? Its last word travels
        by UDP beside its exit: the caller waits FINISH_WAIT_S for it rather than judge
        without it."""
        return any(r.phase == "exiting" for r in self.records().values())

    def _log_sizes(self) -> tuple[int, ...]:
        sizes = []
        for log in self.logs:
            try:
                sizes.append(Path(log).stat().st_size)
            except OSError:
                sizes.append(-1)
        return tuple(sizes)

    def look(self) -> Hang | None:
        """At most every LOOK_S: a hang, or None."""
        if self.slurm.monotonic() < self._next:
            return None
        self._next = self.slurm.monotonic() + LOOK_S
        self._channel()
        if not self.limits.any:
            return None
        now = self.slurm.time()
        sizes = self._log_sizes()
        if sizes != self._sizes:
            self._sizes, self.output_at = sizes, now
        progress = self.records()
        silent = self.channel_silent
        # while the channel is silent: the ranks that can still be read (none: the output)
        expected = len(progress) if silent else self.world
        training = [r.boundaries for r in progress.values() if r.phase == "training"]
        if training and len(training) == expected:
            self.clock.add(now, min(training))
        else:
            self.clock.skip()
        limits = self.limits.timed(self.clock.step_s(), self.clock.longest_s)
        return assess(progress, self.world, self.started_at, now,
                      replace(limits, plain=True) if silent and not progress else limits,
                      self.output_at, watched=set(progress) if silent else None)

    def _channel(self) -> None:
        """Say once when the ranks' progress stopped reaching the board (silence.py)."""
        if self.silence is None:
            return
        run = (self.state.run_id, self.restart_count)
        heard = {r.node for r in self.board.records().values()
                 if (r.address.run_id, r.address.restart_count) == run}
        if note := self.silence.look(heard, self.nodes, self.slurm.monotonic()):
            say(note)

    def failed_now(self) -> dict[int, Progress]:
        """This attempt's failed ranks (waiting for the word), by rank, as of now."""
        return {r: rec for r, rec in self.records().items() if rec.phase == "restarting"}

    def gave_up(self) -> Hang | None:
        """The step ended failed because a rank gave up waiting in a collective (without
        in-process restarts): the hang of the ranks it waited for, said in the job log.
        None for any other end."""
        hang = gave_up(self.state.exit_record(self.restart_count), self.records(),
                       self.world, self.slurm.time(), self.limits.beat_s,
                       self.limits.collective_s)
        if hang is not None:
            say(f"HANG: {hang.text()}")
        return hang
