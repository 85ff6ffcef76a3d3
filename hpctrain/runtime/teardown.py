"""Leaving cleanly: the runtime tears down what it set up, however the script ends.

Why: under torch 2.13 a gloo process group left to the interpreter's exit aborts the
process in about one exit of four ("terminate called without an active exception",
SIGABRT: 4 of 12 runs of a two-rank script here). ``destroy_process_group()`` alone is not
enough once a DeviceMesh's group was used (still 4 of 16); with a garbage collection after
it, 0 of 16. A job that did all its work would otherwise end FAILED. ``init()`` made the
group, so the runtime owns its teardown: a script needs no last line for a clean exit.

One :class:`Teardown` per process runs once, from whichever comes first:
``Context.close()``, ``Context.exit_for_requeue()``, or the interpreter's exit (atexit: a
normal return, ``sys.exit``, an uncaught exception after its crash record). In order:

1. the rank's progress record says its script's work ended, and how (phase ``exiting``,
   ``exit=return|crash|requeue``);
2. every checkpoint manager finishes its in-flight save and releases its root lock (the
   save still needs the process group);
3. the progress record says nothing of the job's work is left in this process (phase
   ``exited``; ``flushed=1`` when every save was durable);
4. the process group is destroyed, if ``init()`` made it, and the garbage it leaves in
   reference cycles collected while the process can still do that safely.

The supervisor reads those records when a rank dies after step 3: "every rank finished
and its saves are durable; rank 1 then aborted at exit" is a finished job, not a crash
(:mod:`hpctrain.supervisor.finish`). Stop signals stay routed to the stop flag throughout,
so a preemption arriving during the teardown cannot kill a rank mid-flush.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

from hpctrain.runtime import groups
from hpctrain.runtime.progress import Reporter

EXIT_WORDS = ("return", "crash", "requeue")   # how the script's work ended


class Teardown:
    """The runtime's exit, run once (thread-safe: a signal-free lock, not reentrant)."""

    def __init__(self, reporter: Reporter | None, rank: int) -> None:
        self.reporter = reporter
        self.rank = rank
        self.owns_process_group = False  # init() made it: destroy it at the end
        self.word = "return"             # set by the crash hook and exit_for_requeue
        self.done = False
        self._lock = threading.Lock()

    def mark(self, word: str) -> None:
        """How the script's work ended (the first word that is not ``return`` wins)."""
        if word not in EXIT_WORDS:
            raise ValueError(f"exit word {word!r}: one of {EXIT_WORDS}")
        if self.word == "return":
            self.word = word

    def run(self) -> None:
        """Steps 1-4 of the module docstring; later calls return at once. Never raises:
        it runs at interpreter exit, where an exception would only hide the real one."""
        with self._lock:
            if self.done:
                return
            self.done = True
            if self.reporter is not None:
                self.reporter.ended(self.word)
            flushed = self._flush()
            if self.reporter is not None:
                self.reporter.exited(flushed)
            self._destroy()

    def _flush(self) -> bool:
        """Every open checkpoint manager: in-flight save durable, root lock released."""
        from hpctrain.checkpoint.open_managers import close_all

        return not close_all()   # it printed what failed

    def _destroy(self) -> None:
        if not self.owns_process_group:
            return
        self.owns_process_group = False
        destroy_process_group(self.rank)


def destroy_process_group(rank: int, check: bool = False) -> None:
    """``torch.distributed.destroy_process_group()``, then a garbage collection: after a
    DeviceMesh's group was used, what the destroy leaves in reference cycles still aborts
    the process when the interpreter's exit collects it (4 of 16 exits here; 0 of 16
    with the collection). ``check`` (an attempt ends, the process goes on): a group still
    referenced after that is released or named in the log
    (:func:`hpctrain.runtime.groups.destroy`). Never raises."""
    groups.destroy(rank, check)


_current: Teardown | None = None


def install(reporter: Reporter | None, rank: int, owns_process_group: bool) -> Teardown:
    """This process's teardown, registered at exit once (``init()`` calls it; a second
    ``init()`` in the same process keeps the first registration and takes over the group)."""
    global _current
    if _current is None or _current.done:
        _current = Teardown(reporter, rank)
        atexit.register(_at_exit, _current)
    else:
        _current.reporter = reporter or _current.reporter
    _current.owns_process_group = _current.owns_process_group or owns_process_group
    return _current


def _at_exit(teardown: Teardown) -> None:
    teardown.run()


def mark(word: str) -> None:
    """How this process's script work ended (:meth:`Teardown.mark`), for a caller that
    holds no Context: :func:`hpctrain.runtime.run` once an attempt it could not restart
    leaves on its exception, and the crash hook between two attempts."""
    if _current is not None and not _current.done:
        _current.mark(word)


def group_exists() -> bool:
    """Is a torch.distributed process group up in this process? (No torch import: a
    process that never imported torch.distributed has none.)"""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def after_call(had_group: bool, crashed: bool) -> None:
    """A function job's callable returned (or raised): tear down what it set up, as the
    interpreter's exit would, but before submitit pickles its result and leaves. The
    runtime's teardown when the callable called ``init()``; else a process group the
    callable made itself and left behind (``had_group``: one was there before the call,
    not the callable's to destroy)."""
    if _current is not None and not _current.done:
        if crashed:
            _current.mark("crash")
        _current.run()
    elif not had_group and group_exists():
        destroy_process_group(int(os.environ.get("RANK", "0") or 0))
