"""Restarts inside the running processes: :func:`run` calls ``main(ctx)`` again after a
failure, with no new process, no new import and no new srun step.

When a rank's ``main`` raises, that rank writes its crash record, says so in its progress
record (phase ``restarting``) and tears the attempt down: its checkpoint managers closed,
its process group destroyed. Destroying the group closes its connections, so the peers
waiting for it in a collective fail there too ("Connection closed by peer": gloo), and
do the same. A group's connections close only once nothing refers to it, so the attempt's
references are let go first (its mesh, ``main``'s locals); a group ``main`` keeps
elsewhere (a global) keeps its peers waiting until the collective times out.

When the supervisor sees one rank's attempt fail, or its watchdog finds the step hung, it
asks every rank to leave the attempt (``interrupt`` in the state directory). Each rank's
progress thread then aborts the rank's process groups, which ends a collective the main
thread waits in (gloo: "Connection closed"; whatever else still refers to the groups), and
a second later, if the main thread is still in the attempt, raises :class:`Interrupted` in
it (``SIGURG`` to that thread, whose handler raises; again each second until it leaves),
which ends a wait in Python code (a sleep, a loop).

Every rank then waits for the supervisor's word (``resume``): it decides as for any
restart in the allocation (the decision table, the budget, the ledger) and says ``go``
(``main`` is called again with ``ctx.attempt`` raised, on a process group rebuilt under a
fresh prefix of the one store that outlives the attempts) or ``stop`` (the exception goes
on as it would have without :func:`run`: the process ends, and the supervisor falls back
to a restart in new processes, or to a requeue). A rank that cannot leave its attempt
(frozen, stuck in C, killed) never says it is restarting: the supervisor kills the step
and restarts it in new processes, the path every script has. Without a supervisor (a script run by hand)
a failure is not restarted.

The store: torchrun's agent's (``TORCHELASTIC_USE_AGENT_STORE``), which lives in the
agent; under srun, rank 0's process hosts it. Either outlives any failure :func:`run`
restarts from, since that keeps every process alive.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from hpctrain import protocol as p
from hpctrain.protocol import timeouts as t
from hpctrain.protocol.dialog import Attempt, Resume
from hpctrain.runtime import progress, teardown
from hpctrain.runtime.context import Context, Setup
from hpctrain.runtime.crashrecord import (crash_fields, device_lost, exception_chain,
                                          lost_peer, timed_out, write_crash_record)

if TYPE_CHECKING:
    from torch.distributed import Store

T = TypeVar("T")
INTERRUPT_SIGNAL = signal.SIGURG   # ignored by default: no other use in a training job
# the dialog's clocks, which must nest with the supervisor's: hpctrain.protocol.timeouts
RESUME_POLL_S, RESUME_WAIT_S = t.RESUME_POLL_S, t.RESUME_WAIT_S
ABORT_EVERY_S, SIGNAL_AFTER_S = t.ABORT_EVERY_S, t.SIGNAL_AFTER_S


class Interrupted(Exception):
    """The supervisor asked this attempt to end: the step was hung."""


def run(main: Callable[[Context], T], *, backend: str | None = None,
        signals: Iterable[int] | None = None, env: Mapping[str, str] | None = None,
        timeout_s: float | None = None) -> T:
    """Call ``main(ctx)`` on every rank; when an attempt fails (a rank raises, or the
    supervisor finds the step hung), call it again in the same processes as the supervisor
    decides (``ctx.attempt`` tells which attempt this is). Returns ``main``'s value.

    ``main`` builds what it needs from ``ctx`` each time (model, optimizer, checkpoint
    manager, data) and resumes from ``CheckpointManager.load_latest``, which restores a
    save or snapshot still in this process's memory without reading storage. Arguments as
    :func:`hpctrain.runtime.init`; ``timeout_s`` bounds a collective."""
    setup = Setup.make(backend, signals, env)
    attempts = _Attempts(setup, timeout_s)
    if attempts.off and setup.env.rank == 0:
        print(f"hpctrain: no restarts in these processes: {attempts.off}; a failure restarts "
              "the step in new processes, as with hpctrain.runtime.init()", file=sys.stderr,
              flush=True)
    while True:
        ctx = attempts.connect()
        try:
            result = main(ctx)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                teardown.mark("crash")     # sys.exit(3): the script's work did not finish
            raise
        except KeyboardInterrupt:
            teardown.mark("crash")
            raise
        except BaseException as exc:
            if not attempts.restart(ctx, exc):
                # told to stop (or no supervisor to ask): the exception goes on, and the
                # rank's last word says its work did not end in a return, whatever its
                # death at exit looks like (a job whose ranks all "returned" is COMPLETED)
                teardown.mark("crash")
                raise
            continue
        attempts.done()
        return result


def not_in_place(tp: int, backend: str) -> str:
    """Why a failed attempt of this layout cannot restart in its processes ("" when it
    can): a rank must be able to leave any collective it waits in for a failed peer."""
    if tp > 1 and backend == "gloo":
        # measured on torch 2.13: an abort of the group does not wake a ring all-reduce's
        # receive under DTensor; the peers would wait for the collective timeout
        return (f"tp={tp} on gloo (a rank waiting in a tensor-parallel all-reduce for a "
                "failed peer is not freed by an abort)")
    return ""


# NCCL's watchdog, on a collective's timeout or error, by default (3) ends the process
# without aborting its communicators: no attempt could start again in it. 2 aborts the
# communicators and raises in the thread that waits, which run() handles as a failed attempt.
NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def nccl_settings(backend: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What run() sets in the environment before its first NCCL process group, so that a
    failed collective ends the attempt, not the process; a value the job set is kept."""
    if "nccl" not in backend or NCCL_ERROR_HANDLING in environ:
        return {}
    return {NCCL_ERROR_HANDLING: "2"}


class _Attempts:
    """The attempts of one process: their store, their connection, their end."""

    def __init__(self, setup: Setup, timeout_s: float | None) -> None:
        self.setup, self.timeout = setup, setup.collective_timeout(timeout_s)
        e = setup.env
        self.attempt = int(setup.environ.get(p.STEP_ATTEMPT) or 0)
        self.state = setup.environ.get(p.STATE_DIR, "")
        self.store = _base_store(setup.environ, e.master_addr, e.master_port, e.rank,
                                 e.world_size, self.timeout)
        self._main = threading.main_thread().ident
        self._asked = False          # a SIGURG on its way is the supervisor's
        self._interrupted = False    # the supervisor asked this attempt to end
        self._leaving = False        # this attempt ended: main is not running
        self._aborter: threading.Thread | None = None   # _leave, while it runs
        self.off = not_in_place(e.tp, setup.backend)   # why attempts cannot restart here
        if not self.off:
            for name, value in nccl_settings(setup.backend, os.environ).items():
                os.environ[name] = value    # read when the first NCCL group is made
        signal.signal(INTERRUPT_SIGNAL, self._on_signal)
        if setup.reporter is not None:
            setup.reporter.wrapped = True   # in place or not, a crash is retried by default
        if setup.reporter is not None and not self.off:
            setup.reporter.inprocess = True
            setup.reporter.on_interrupt = self._interrupt

    # ---- an attempt ----------------------------------------------------------------------
    def connect(self) -> Context:
        """This attempt's process group, on its own prefix of the store, and its Context."""
        import torch.distributed as dist

        e = self.setup.env
        dist.init_process_group(self.setup.backend, rank=e.rank, world_size=e.world_size,
                                store=dist.PrefixStore(f"hpctrain/attempt-{self.attempt}/",
                                                       self.store),
                                timeout=self.timeout)
        return self.setup.context(owns_process_group=True, attempt=self.attempt)

    def restart(self, ctx: Context, exc: BaseException) -> bool:
        """The attempt failed with ``exc``: end it and wait for the supervisor's word. True
        when the next attempt may start (then it is this process's next ``connect``)."""
        # the attempt is over: an interrupt from now on (the supervisor asks every rank of a
        # failed attempt, this one too), or still on its way (its SIGURG could not reach a
        # rank waiting in a collective), must not break the teardown or the wait
        self._leaving = True
        self._asked = False
        # failing of the supervisor's interrupt (an aborted collective, Interrupted), of a
        # wait for a peer (timeout) or of a peer leaving (its connections closed as it tore
        # down: "peer") is not a failure of its own; only a crash writes the crash record
        word = "interrupted" if isinstance(exc, Interrupted) or self._interrupted else \
            "timeout" if timed_out(exc) else "peer" if lost_peer(exc) else "crash"
        if getattr(exc, "requeue_cause", None) or not self.state or self.off:
            return False        # the storage failed (requeue), no supervisor to ask, or a
        #                         layout whose ranks cannot all leave the attempt
        reporter, e = self.setup.reporter, ctx.env
        if word == "crash":   # the first rank's (its peers fail of it); not the exit's word
            write_crash_record(e.exit_file, type(exc), exc, step=ctx.step,
                               restart_count=e.restart_count, job_id=e.job_id, rank=e.rank,
                               node=e.node, run_id=e.run_id, at_step=progress.position())
        error = str(crash_fields(type(exc), exc, step=None, restart_count=0, job_id=None,
                                 rank=e.rank)["error"])
        if word != "interrupted":   # in the job log, as an uncaught exception would be
            traceback.print_exception(exc)
        if reporter is not None and device_lost(exc):
            # the device context is gone for this process: the supervisor stops the attempt
            # at once and restarts the step in new processes
            reporter.inprocess = False
            print(f"hpctrain: rank {e.rank}: a device error: this process cannot start "
                  "another attempt", file=sys.stderr, flush=True)
        print(f"hpctrain: rank {e.rank}: attempt {self.attempt} ended ({word}: {error}); "
              "waiting for the supervisor's word on the next one", file=sys.stderr, flush=True)
        if reporter is not None:
            reporter.fail(word, error)
        self.end(ctx, exc)
        if not self.resumed(ctx):
            return False
        self.attempt += 1
        self._interrupted = self._leaving = False
        if reporter is not None:
            reporter.new_attempt(self.attempt)
        return True

    def end(self, ctx: Context, exc: BaseException) -> None:
        """Tear the attempt down: its checkpoint managers closed (root locks released; a
        save the broken group fails is reported, not raised), every reference to its
        process groups let go, the groups destroyed and collected.

        A group lives while anything refers to it (the mesh, a manager, ``main``'s locals
        in the traceback), and while it lives its connections stay open: the peers waiting
        in a collective would wait until it times out instead of failing at once."""
        from hpctrain.checkpoint.open_managers import close_all

        close_all(leaving=False)
        for link in exception_chain(exc):                 # causes included
            traceback.clear_frames(link.__traceback__)
        ctx.mesh = None  # type: ignore[assignment]
        self.setup.current = None
        if self._aborter is not None:
            # it holds the groups it aborts: let it go before they are destroyed, or a
            # group outlives the destroy and its peers keep waiting on its connections
            self._aborter.join(timeout=2 * ABORT_EVERY_S)
            self._aborter = None
        teardown.destroy_process_group(self.setup.env.rank, check=True)   # and its peers freed

    def done(self) -> None:
        """``main`` returned: nothing more to interrupt."""
        signal.signal(INTERRUPT_SIGNAL, signal.SIG_DFL)
        if self.setup.reporter is not None:
            self.setup.reporter.on_interrupt = None

    def resumed(self, ctx: Context) -> bool:
        """Wait for the supervisor's word on the next attempt: True for go."""
        reporter = self.setup.reporter
        path = reporter.request_path(p.RESUME) if reporter is not None else \
            os.path.join(self.state, p.RESUME)
        to = Attempt(ctx.env.run_id or "", ctx.restart_count, self.attempt + 1)
        end = time.monotonic() + RESUME_WAIT_S
        while time.monotonic() < end:
            word = Resume.read(p.read_record(path), to)
            if word is not None:
                return word.action == "go"
            time.sleep(RESUME_POLL_S)
        print(f"hpctrain: rank {ctx.env.rank}: no word on attempt {self.attempt + 1} within "
              f"{RESUME_WAIT_S:.0f} s: leaving as if told to stop", file=sys.stderr, flush=True)
        return False

    # ---- the supervisor's interrupt ------------------------------------------------------
    def _interrupt(self) -> None:
        """On the progress thread: make the main thread leave its attempt, wherever it
        waits: in a collective (aborting the process groups ends it with an error) or in
        Python code (SIGURG, whose handler raises; it wakes a sleep too)."""
        if self._leaving:
            return               # it left already (the rank whose failure started it all)
        self._interrupted = self._asked = True
        print(f"hpctrain: rank {self.setup.env.rank}: the supervisor asks attempt "
              f"{self.attempt} to end", file=sys.stderr, flush=True)
        self._aborter = threading.Thread(target=self._leave, name="hpctrain-abort",
                                         daemon=True)
        self._aborter.start()

    def _leave(self) -> None:
        """Make the main thread leave its attempt: abort every process group of the
        attempt, again every ABORT_EVERY_S (an aborted group ends the collective waiting in
        it with an error; one the main thread starts on it afterwards would wait forever),
        and every SIGNAL_AFTER_S while it is still there, SIGURG, whose handler raises: it
        is in Python code then (a sleep, a loop). Not at once: raised inside a collective's
        Python callbacks (DTensor's), the exception left the next wait stuck for good."""
        from torch.distributed import distributed_c10d

        groups = list(distributed_c10d._world.pg_map)   # kept: abort does not unregister
        start = time.monotonic()
        signalled = start
        while not self._leaving and time.monotonic() - start < RESUME_WAIT_S:
            for group in groups:
                try:
                    group.abort()
                except Exception as exc:  # noqa: BLE001 - the next round, or the signal
                    print(f"hpctrain: rank {self.setup.env.rank}: could not abort a "
                          f"process group: {exc}", file=sys.stderr, flush=True)
            # again every SIGNAL_AFTER_S: code that caught the first (a broad except) is
            # asked again; one that landed as the main thread was leaving was ignored
            if time.monotonic() - signalled >= SIGNAL_AFTER_S and not self._leaving:
                signalled = time.monotonic()
                signal.pthread_kill(self._main, INTERRUPT_SIGNAL)   # wakes a sleep too
            time.sleep(ABORT_EVERY_S)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # a stray SIGURG is not a request; and one that lands as the main thread leaves the
        # attempt on its own (a collective failed: in run's except clause, or entering
        # restart before it says so) must not break that: seen on the devcluster
        if self._asked and not self._leaving and getattr(frame, "f_code", None) not in \
                _LEAVING_CODE:
            raise Interrupted("the supervisor found the step hung and asked this attempt "
                              "to end")


# the frames a main thread on its way out of an attempt runs in before it says so
_LEAVING_CODE = (run.__code__, _Attempts.restart.__code__)


def _base_store(environ: Mapping[str, str], addr: str, port: int, rank: int, world: int,
                timeout: timedelta) -> Store:
    """The store every attempt's process group is made on: torchrun's agent hosts it (all
    ranks are clients), else rank 0 (MASTER_ADDR/MASTER_PORT, as the templates set them;
    else the first node and the job's port, as :func:`hpctrain.runtime.init` finds them)."""
    from torch.distributed import TCPStore

    agent = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return TCPStore(environ.get("MASTER_ADDR", addr), int(environ.get("MASTER_PORT", port)),
                    world, is_master=rank == 0 and not agent, timeout=timeout,
                    wait_for_workers=False)
