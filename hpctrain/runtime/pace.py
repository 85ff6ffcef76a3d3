"""A rank's own time per step, apart from the time it waits for the others.

In synchronous training every step waits for the slowest rank, so every rank's step takes
the same wall time; what tells a slow node's ranks apart is how much of it was their own
work. The slow rank works the whole step, its peers work less and wait in a collective for
it. Measured here, for any script under ``hpctrain.runtime`` (its heartbeat carries the
figure, :class:`hpctrain.protocol.progress.Progress`'s ``own``; the supervisor's
:mod:`hpctrain.supervisor.slow` compares the nodes):

- **plain ``torch.distributed`` collectives** (``all_reduce``, ``broadcast``, ``all_gather``,
  ``reduce_scatter``, ``barrier``, ...; the runtime's own stop agreement at every step
  boundary): the time a blocking call takes is the rank's wait plus the transfer; a step's
  own time is its wall time less those. An ``async_op=True`` call is not timed (its wait
  happens in ``work.wait()``, which torch does not let us wrap): a script that overlaps all
  its communication shows every rank's whole step.
- **DistributedDataParallel** (the gradients' all-reduce runs inside ``backward()``, in
  C++): DDP's own timers (sampled every iteration here: ``forward`` and ``backward``
  compute time, which exclude the wait for the buckets' all-reduce), for every DDP made
  once the runtime started or, with the Lightning and Hugging Face callbacks, once the
  callback was imported (:func:`watch_new_ddps`).
- Time in a phase other than training (a save, a load, an evaluation between steps) is
  not a step's: left out.

The figure sent is the median of the newest WINDOW steps: one slow step, a save or a GC
pause moves it little. The cost: two clock reads per collective and per step, a sorted
list of WINDOW numbers per heartbeat (a benchmark: benchmarks/pace_bench.py).
"""

from __future__ import annotations

import functools
import inspect
import statistics
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

WINDOW = 8                   # steps: the figure is the median of the newest ones
# the blocking collectives of torch.distributed timed as waits (those a module has)
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "all_gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor",
               "all_to_all", "all_to_all_single", "barrier", "gather", "scatter",
               "broadcast_object_list")
NS = 1e-9


class Pace:
    """One rank's own time per step (see the module docstring). The training loop's side
    only adds numbers; :meth:`own` is read by the heartbeat thread."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.last: float | None = None   # the last step boundary
        self.waited = 0.0                # in blocking collectives since then
        self.left_out = 0.0              # in other phases since then
        self.paused_at: float | None = None
        self.steps: deque[float] = deque(maxlen=WINDOW)
        self.ddps: weakref.WeakSet[Any] = weakref.WeakSet()
        self._ddp_sample: dict[int, int] = {}   # each DDP's newest sample seen (its start)

    # ---- the training loop's side ---------------------------------------------------------
    def collective(self, seconds: float) -> None:
        self.waited += seconds

    def pause(self) -> None:
        """A phase that is not a step's began (a save, a load, between steps)."""
        if self.paused_at is None:
            self.paused_at = self.clock()

    def resume(self) -> None:
        if self.paused_at is not None:
            self.left_out += self.clock() - self.paused_at
            self.paused_at = None

    def boundary(self) -> None:
        """A step ended: its own time kept (from DDP's timers when a DDP ran in it)."""
        now = self.clock()
        if self.last is not None and self.paused_at is None:
            own = self._ddp_own()
            if own is None:
                own = now - self.last - self.waited - self.left_out
            self.steps.append(max(own, 0.0))
        self.last, self.waited, self.left_out = now, 0.0, 0.0
        if self.paused_at is not None:
            self.paused_at = now

    def restart(self) -> None:
        """A new attempt (or a step begins after other work): nothing before counts."""
        self.last, self.waited, self.left_out, self.paused_at = None, 0.0, 0.0, None

    # ---- the heartbeat's side -------------------------------------------------------------
    def own(self) -> float | None:
        """The median own time per step of the newest WINDOW steps; None before 3."""
        steps = list(self.steps)
        return statistics.median(steps) if len(steps) >= 3 else None

    # ---- DistributedDataParallel ----------------------------------------------------------
    def watch_ddp(self, module: Any) -> None:
        """Read ``module``'s (a DDP's) timers at each boundary, sampled every iteration."""
        try:
            module._set_ddp_runtime_logging_sample_rate(1)
        except (AttributeError, RuntimeError):
            return          # a torch without DDP's timers: the wall-time measure stands
        self.ddps.add(module)

    def _ddp_own(self) -> float | None:
        """The compute time (forward + backward) of each DDP's newest iteration, summed;
        None when no DDP ran a new one since the last boundary."""
        total, fresh = 0.0, False
        for module in list(self.ddps):
            try:
                data = module._get_ddp_logging_data()
            except (AttributeError, RuntimeError):
                continue
            start = int(data.get("forward_compute_time_start", 0) or 0)
            if not start or self._ddp_sample.get(id(module)) == start:
                continue
            self._ddp_sample[id(module)] = start
            fresh = True
            total += (int(data.get("forward_compute_time", 0) or 0) +
                      int(data.get("backward_compute_time", 0) or 0)) * NS
        return total if fresh else None


_pace: Pace | None = None
# DDPs made since the watch was installed, before any Pace (a framework wraps the model
# before its callback attaches the runtime): the Pace installed next adopts them
_made: weakref.WeakSet[Any] = weakref.WeakSet()


def current() -> Pace | None:
    return _pace


def install(pace: Pace) -> Pace:
    """Make ``pace`` this process's: torch.distributed's blocking collectives and every
    DistributedDataParallel made from now on report to it (installed once per process;
    a new attempt's reporter takes it over)."""
    global _pace
    _pace = pace
    _wrap_collectives()
    watch_new_ddps()
    for module in list(_made):
        pace.watch_ddp(module)
    return pace


def _wrap_collectives() -> None:
    import torch.distributed as dist

    for name in COLLECTIVES:     # (a second install finds them wrapped: left as they are)
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "_hpctrain_timed", False):
            setattr(dist, name, _timed(fn))


def _timed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with the time of each blocking call given to the current Pace."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    at = params.index("async_op") if "async_op" in params else None
    compiling = _compiling_check()
    clock = time.perf_counter

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        pace = _pace
        if pace is None or kwargs.get("async_op") or (at is not None and len(args) > at
                                                      and args[at]) or compiling():
            return fn(*args, **kwargs)
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            pace.waited += clock() - start

    timed._hpctrain_timed = True     # type: ignore[attr-defined]
    return timed


def _compiling_check() -> Callable[[], bool]:
    """Are we inside torch.compile's tracing? There, no clock reads (they would break the
    graph). Looked up once: the wrapper runs on every collective."""
    import torch

    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return check if callable(check) else (lambda: False)


def watch_new_ddps() -> None:
    """Every DistributedDataParallel made from now on reports to the current Pace, or to
    the next one installed (the framework integrations call this when imported: the
    framework wraps its model before the runtime attaches). Once per process."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    init = DDP.__init__
    if getattr(init, "_hpctrain_timed", False):
        return

    @functools.wraps(init)
    def watched(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _made.add(self)
        if _pace is not None:
            _pace.watch_ddp(self)

    watched._hpctrain_timed = True      # type: ignore[attr-defined]
    DDP.__init__ = watched              # type: ignore[method-assign]
