"""Progress events: every rank says how far it got, locally, with no collective.

A daemon thread rewrites ``progress/rank-N`` (:mod:`hpctrain.protocol`) in the node's own
directory every heartbeat, and one rank per node relays the node's records to the
supervisor over the network (:mod:`hpctrain.runtime.relay`): nothing of it touches shared
storage. (Without a supervisor's channel the records go to the state directory.) A record
says the step (``ctx.step = n``), how many step boundaries it reached (each
``stop_requested()`` call), the phase (``startup``, ``training``, ``loading``, ``saving``,
``exiting``, ``exited``), when any of them last changed, and the heartbeat itself; once the
script's work has ended, how (``exit``) and whether its saves were durable (``flushed``).
The training loop only sets fields (no I/O on its path); the supervisor's hang watchdog
reads the files without torch.

Rank 0 also keeps the history (``<state dir>/history``): one JSON line per step boundary
and phase change, queued by the training loop (no I/O there) and appended by the thread
every HISTORY_S (and at the end), so ``hpctrain report`` can tell start-up, training,
saving and lost work apart later: one shared-storage write per HISTORY_S, not per step.

The same thread answers the supervisor's stack request (relayed when it sees a hang) with
every thread's Python stack in the state directory's ``stacks/rank-N``. It can while the
main thread waits in a collective or a read (both release the GIL). A process frozen while holding the GIL, or
stopped, answers nothing and its heartbeat ages: that is news to the supervisor too.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from hpctrain import protocol as p
from hpctrain.files import atomic_write
from hpctrain.protocol.dialog import Attempt, new_seq
from hpctrain.protocol.progress import Progress, Work
from hpctrain.runtime.pace import Pace
from hpctrain.runtime.relay import Relay
from hpctrain.runtime.relay import from_env as relay_from_env

ANSWER_POLL_S = 0.5   # how often the thread looks for a stack request
HISTORY_S = 10.0      # how often rank 0 appends its queued history lines
# how long a leaving rank waits for the node's relay role, to clean up after itself (its
# last word went out already): another rank's flush takes milliseconds
LEAVE_WAIT_S = 0.2

_current: Reporter | None = None


class Reporter:
    """One rank's progress record and its heartbeat thread."""

    def __init__(self, state_dir: str, rank: int, *, node: str = "", run_id: str = "",
                 restart_count: int = 0, attempt: int = 0,
                 beat_s: float = p.DEFAULT_HEARTBEAT_S, relay: Relay | None = None) -> None:
        # the record and the requests: in the node's directory when relayed
        self.local = relay.local if relay is not None else Path(state_dir)
        self.relay = relay
        self.path = p.rank_file(self.local, p.PROGRESS, rank)
        self.stacks = p.rank_file(state_dir, p.STACKS, rank)
        self.dump = self.local / p.DUMP
        self.beat_s = beat_s
        self.ident = {"run_id": run_id, "restart_count": restart_count, "attempt": attempt,
                      "rank": rank, "node": node, "pid": os.getpid()}
        self.step: int | None = None
        self.boundaries = 0
        # position(): where this attempt's steps count from, and whether that is known (the
        # job's very first attempt starts at 0; any other from the checkpoint it loads)
        self.resumed_at = self.boundaries_at = 0
        self.anchored = restart_count == 0 and attempt == 0
        self.phase = "startup"
        self.changed_at = time.time()
        self.exit = ""      # how the script's work ended: return, crash, requeue (teardown)
        self.flushed: bool | None = None   # at the end of the teardown: every save durable?
        self.failed = ""    # this attempt failed in-process: crash or hang (runtime.run)
        self.error = ""     # ...and the error, one line
        self.inprocess = False   # runtime.run: an attempt can restart in this process
        self.wrapped = False     # runtime.run: main is wrapped (its crashes are retried)
        self.work: Work | None = None   # what a step does (ctx.set_work), for report's MFU
        self.pace = Pace()       # its own time per step (hpctrain.runtime.pace): paused
        self.pace.pause()        # ...until training begins
        self.on_interrupt: Callable[[], None] | None = None   # runtime.run's, else None
        self._answered = ""
        self._interrupted = ""
        # rank 0's history: (time, event fields) queued by the training loop
        self.history = Path(state_dir) / p.HISTORY if rank == 0 else None
        self._events: deque[dict[str, object]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hpctrain-progress", daemon=True)

    # ---- the training loop's side: set fields only ------------------------------------
    def set_step(self, step: int | None) -> None:
        if step != self.step:
            self.step, self.changed_at = step, time.time()

    def set_work(self, work: Work) -> None:
        """What each step does from now on (tokens or samples, FLOPs): in the record and,
        once per change, in the history (``report`` counts each step's work from it)."""
        if work != self.work:
            self.work = work
            self._note(event="work", **work.fields())

    def resumed(self, step: int | None) -> None:
        """The attempt's state was loaded from checkpoint ``step`` (None: it starts fresh):
        the steps of :meth:`position` count from there."""
        self.resumed_at, self.boundaries_at = step or 0, self.boundaries
        self.anchored = True

    def position(self) -> int | None:
        """The step in progress: the script's own (``ctx.step``), else the checkpoint step
        this attempt resumed from (a load through the checkpoint manager; the job's very
        first attempt: 0) plus the step boundaries passed since (a script that never
        calls ``stop_requested`` stays at the step it resumed from). None when neither is
        known (an attempt that loaded nothing through the manager): a crash's position is
        then unknown, never a count from some other origin."""
        if self.step is not None:
            return self.step
        if not self.anchored:
            return None
        return self.resumed_at + self.boundaries - self.boundaries_at

    def boundary(self) -> None:
        """A step boundary was reached (``stop_requested()`` was called)."""
        self.boundaries += 1
        self.changed_at = time.time()
        if self.phase == "startup":
            self.set_phase("training")
        self.pace.boundary()
        # the step: the script's own, else counted from the checkpoint this attempt loaded
        # (report tells a step re-done after a restart from one done once by it: counts of
        # boundaries alone begin anew in each attempt and would collide)
        self._note(event="step", step=self.position(), n=self.boundaries)

    def set_phase(self, phase: str) -> str:
        """Enter ``phase``; the phase before (to go back to)."""
        before, self.phase, self.changed_at = self.phase, phase, time.time()
        if phase == "training":    # a step's time runs only in training (not a save, a load)
            self.pace.resume()
        else:
            self.pace.pause()
        if phase != before:
            self._note(event="phase", phase=phase)
        return before

    def ended(self, word: str) -> None:
        """The script's work ended (``return``, ``crash``, ``requeue``): said at once, in
        case the process dies in what follows (:mod:`hpctrain.runtime.teardown`)."""
        self.exit = word
        self.set_phase("exiting")
        self.write(urgent=True)

    def exited(self, flushed: bool) -> None:
        """Nothing of the job's work is left in this process (``flushed``: every save was
        durable); only the teardown remains. The heartbeat stops (the record stays as the
        rank's last word) and the history is appended."""
        self.flushed = flushed
        self.set_phase("exited")
        self._stop_beats()            # its last beat must not land after this record
        self.write(urgent=True)
        if self.relay is not None:
            self.relay.flush()        # the node's records out; another rank relays the rest
        self.drain()

    def new_attempt(self, attempt: int) -> None:
        """An attempt starts again in this process (runtime.run): its progress from zero."""
        self.ident["attempt"] = attempt
        self.step, self.boundaries, self.failed, self.error = None, 0, "", ""
        self.resumed_at = self.boundaries_at = 0
        self.anchored = False      # until it loads: its steps do not count from 0
        self.pace.restart()        # the last attempt's steps say nothing of this one's pace
        self.set_phase("startup")
        self.write(urgent=True)

    def fail(self, word: str, error: str) -> None:
        """This attempt failed (``crash``, ``hang``); the rank waits for the supervisor's
        word on the next one (phase ``restarting``). Said at once."""
        self.failed, self.error = word, error
        self.set_phase("restarting")
        self.write(urgent=True)

    def _note(self, **event: object) -> None:
        if self.history is not None:   # deque.append is atomic: no lock on the loop's path
            # stamped now: lines wait up to HISTORY_S, and the attempt may change meanwhile
            self._events.append({"restart": self.ident["restart_count"],
                                 "attempt": self.ident["attempt"],
                                 "t": round(time.time(), 3), **event})

    # ---- the thread ----------------------------------------------------------------------
    def start(self) -> Reporter:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass   # storage trouble must not stop training: writes are retried each beat
        self._note(event="phase", phase=self.phase)
        atexit.register(self.drain)   # a normal exit (or exit_for_requeue) keeps the tail
        if self.relay is not None:
            atexit.register(self.leave_node)
        self.write()
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self.relay is not None:
            self.relay.release()
        self.drain()

    def leave_node(self) -> None:
        """At the process's exit: the heartbeat stops (a beat after this would write the
        record back, a tick take the relay role back), the rank's last word goes out (the
        node's records with it when it can be the relay: it waits up to LEAVE_WAIT_S for the
        role; else its own record, once, unless :meth:`exited` sent it), and its record
        leaves the node directory with those of ranks whose processes are gone; the last
        rank to leave takes the directory along. Each rank removes its own record before it
        looks at the others', so of two ranks leaving at once one sees the other gone,
        however long the relay holds the role. A node whose ranks were all killed keeps its
        directory, in node memory that a reboot (or Slurm's per-job /dev/shm) clears."""
        assert self.relay is not None
        if os.getpid() != self.relay.pid:
            return      # a forked child exiting: the rank's record is not its own
        self._stop_beats()
        if self.phase != "exited":
            self.write()          # the step and phase as they are now, not a beat ago
        end = time.monotonic() + LEAVE_WAIT_S
        while not (sent := self.relay.flush()) and time.monotonic() < end:
            time.sleep(0.05)    # another rank flushes as it leaves: the role is free soon
        if not sent and self.phase != "exited":
            self.relay.send_own(self.record())    # a working relay may not send it in time
        self.relay.close()
        remove_node_dir(self.local, self.path)

    def _stop_beats(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def request_path(self, name: str) -> Path:
        """Where the supervisor's request ``name`` (``resume``) reaches this rank."""
        return self.local / name

    def drain(self) -> None:
        """Append the queued history lines (rank 0)."""
        if self.history is None or not self._events:
            return
        lines = []
        while self._events:
            lines.append(json.dumps(self._events.popleft()))
        try:
            with open(self.history, "a", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
        except OSError:
            pass   # the report then misses these lines; training goes on

    def record(self) -> dict[str, str]:
        """The record as written and sent (its fields: :class:`Progress`)."""
        return Progress(
            int(self.ident["rank"]), self.address(), self.changed_at, time.time(),
            node=str(self.ident["node"]), pid=int(self.ident["pid"]),
            step="" if self.step is None else str(self.step), boundaries=self.boundaries,
            phase=self.phase, exit=self.exit, flushed=self.flushed, inprocess=self.inprocess,
            wrapped=self.wrapped, failed=self.failed, error=self.error, work=self.work,
            own=self.pace.own() or 0.0).fields()

    def write(self, urgent: bool = False) -> None:
        """Rewrite the record; ``urgent``: also send it to the supervisor now, from this
        process (the node's relay sends it too, within ANSWER_POLL_S)."""
        record = self.record()
        try:
            p.write_record(self.path, record)
        except OSError:
            pass   # the file system hiccups: the next beat tries again
        if urgent and self.relay is not None:
            self.relay.send_own(record)    # the news goes out now, whoever relays the node

    def _loop(self) -> None:
        next_beat = time.monotonic() + self.beat_s
        next_history = time.monotonic() + HISTORY_S
        while not self._stop.wait(min(ANSWER_POLL_S, self.beat_s)):
            if self.relay is not None:
                self.relay.tick()
            self._answer()
            self._interrupt()
            if time.monotonic() >= next_history:
                self.drain()
                next_history = time.monotonic() + HISTORY_S
            if time.monotonic() >= next_beat:
                self.write()
                next_beat = time.monotonic() + self.beat_s

    def address(self) -> Attempt:
        """This rank's attempt, as the supervisor's requests address it."""
        return Attempt(str(self.ident["run_id"]), int(self.ident["restart_count"]),
                       int(self.ident["attempt"]))

    def _request(self, name: Path, answered: str) -> str:
        """The seq of request ``name`` when it is a new one for this attempt, else ''."""
        return new_seq(p.read_record(name), self.address(), answered)

    def _interrupt(self) -> None:
        """The supervisor asks this attempt to end (a hang, restarted in-process)."""
        if self.on_interrupt is None:
            return
        seq = self._request(self.dump.with_name(p.INTERRUPT), self._interrupted)
        if seq:
            self._interrupted = seq
            self.on_interrupt()

    def _answer(self) -> None:
        """Write this process's stacks once per stack request of this attempt."""
        seq = self._request(self.dump, self._answered)
        if not seq:
            return
        self._answered = seq
        try:
            self.stacks.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.stacks, f"seq={seq}\n" + self.format_stacks())
        except OSError:
            pass

    def format_stacks(self) -> str:
        """Every thread's Python stack, the main thread first (the one the hang is in)."""
        names = {t.ident: t.name for t in threading.enumerate()}
        main = threading.main_thread().ident
        frames = sorted(sys._current_frames().items(), key=lambda kv: kv[0] != main)
        head = (f"rank {self.ident['rank']} on {self.ident['node'] or '?'} "
                f"(pid {self.ident['pid']}), step {self.step if self.step is not None else '?'}"
                f", {self.boundaries} step boundaries, phase {self.phase}\n")
        parts = [head]
        for ident, frame in frames:
            if ident == threading.get_ident():
                continue   # this thread: it only reports
            label = "main thread" if ident == main else f"thread {names.get(ident, ident)}"
            parts.append(f"--- {label} ---\n" + "".join(traceback.format_stack(frame)))
        return "".join(parts)


def remove_node_dir(local: Path, own: Path) -> None:
    """Remove ``own`` record and those of processes that are gone from node directory
    ``local``; then, when no record is left, the directory itself."""
    records = local / p.PROGRESS
    try:
        own.unlink(missing_ok=True)
        for path in records.iterdir():
            pid = p.read_record(path).get("pid", "")
            if pid.isdigit() and not _alive(int(pid)):
                path.unlink(missing_ok=True)
        records.rmdir()                        # fails while a live rank's record is there
        for leftover in local.iterdir():
            leftover.unlink()
        local.rmdir()
    except OSError:
        pass


def _alive(pid: int) -> bool:
    """Whether process ``pid`` can still write its record: a zombie (killed, its parent
    yet to reap it, as a loaded slurmstepd may be) cannot."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True     # no /proc: alive as far as anyone can tell
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def start_from_env(env: Mapping[str, str], rank: int, node: str | None) -> Reporter | None:
    """Start this rank's reporter when the supervisor runs the job (it sets the state dir);
    None otherwise (a script run by hand)."""
    global _current
    state = env.get(p.STATE_DIR)
    if not state:
        return None
    try:
        beat = float(env.get(p.HEARTBEAT_S) or p.DEFAULT_HEARTBEAT_S)
        attempt = int(env.get(p.STEP_ATTEMPT) or 0)
        restart = int(env.get(p.RESTART_COUNT) or env.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        beat, attempt, restart = p.DEFAULT_HEARTBEAT_S, 0, 0
    if _current is not None:
        _current.close()
    run_id = env.get(p.RUN_ID, "")
    relay = relay_from_env(env, run_id, restart, node or "", beat)
    _current = Reporter(state, rank, node=node or "", run_id=run_id, restart_count=restart,
                        attempt=attempt, beat_s=beat, relay=relay).start()
    return _current


def resumed(step: int | None) -> None:
    """The checkpoint step the running attempt loaded (None: none): see
    :meth:`Reporter.resumed`. Does nothing without a reporter."""
    if _current is not None:
        _current.resumed(step)


def position() -> int | None:
    """The running attempt's step as far as it is known (:meth:`Reporter.position`)."""
    return _current.position() if _current is not None else None


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Report ``name`` (``saving``, ``loading``) while the block runs: the watchdog gives
    it its own timeout. Does nothing without a reporter."""
    reporter = _current
    if reporter is None:
        yield
        return
    before = reporter.set_phase(name)
    try:
        yield
    finally:
        reporter.set_phase(before)
