"""A rank's own time per step, apart from the time it waits for the others.

In synchronous training every step waits for the slowest rank, so every rank's step takes
the same wall time; what tells a slow node's ranks apart is how much of it was their own
work. The slow rank works the whole step, its peers work less and wait in a collective for
it. Measured here, for any script under ``hpctrain.runtime`` (its heartbeat carries the
figure, :class:`hpctrain.protocol.progress.Progress`'s ``own``; the supervisor's
:mod:`hpctrain.supervisor.slow` compares the nodes), as the step's wall time less:

- **the waits of torch.distributed collectives**: every ``Work.wait()`` made from Python
  (a blocking ``all_reduce``, ``broadcast``, ``barrier``, ... waits through it, whatever
  name the script imported it by; so does ``handle.wait()`` of an ``async_op=True`` call,
  and ``handle.get_future().wait()``), but not the functional collectives' (DTensor,
  ``torch.distributed._functional_collectives``: their wait is an operator),
  on the training loop's thread only (an async checkpoint's commit waits on its writer's
  thread: not the step's). With gloo the wait is the CPU's; with NCCL ``wait()`` only
  orders the GPU's stream, so on GPUs this part measures little (DDP's below does);
- **DistributedDataParallel's gradient wait** (its all-reduce runs inside ``backward()``,
  in C++): from DDP's own timers, sampled every iteration, the time its buckets'
  communication went on after the backward's compute ended, every iteration's (read after
  each forward: a step of several iterations counts them all), for every DDP made once the
  runtime started or, with the Lightning and Hugging Face callbacks, once the callback was
  imported (:func:`watch_new_ddps`). DDP reports an iteration at the next one's forward:
  a step's figure may carry the one before's wait, which the median evens out;
- time in a phase other than training (a save, a load, an evaluation between steps), and
  a wait within it only once.

The figure sent is the median of the newest WINDOW steps: one slow step, a save or a GC
pause moves it little. The cost (benchmarks/pace_bench.py): a clock read on each side of a
wait, a sample of DDP's timers per iteration, a sorted list of WINDOW numbers a heartbeat.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

WINDOW = 8                   # steps: the figure is the median of the newest ones
NS = 1e-9


class Pace:
    """One rank's own time per step (see the module docstring). The training loop's side
    only adds numbers; :meth:`own` is read by the heartbeat thread."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.last: float | None = None   # the last step boundary
        self.waited = 0.0                # in collectives' waits since then (DDP's too)
        self.left_out = 0.0              # in other phases since then
        self.paused_at: float | None = None
        self.steps: deque[float] = deque(maxlen=WINDOW)
        self.ddps: weakref.WeakSet[Any] = weakref.WeakSet()
        self._ddp_sample: dict[int, int] = {}   # each DDP's newest sample seen (its start)
        self.owner = threading.get_ident()      # the training loop's thread (its boundaries)

    # ---- the training loop's side ---------------------------------------------------------
    def collective(self, seconds: float) -> None:
        """A wait for the others of ``seconds``; in a paused phase it is left out already."""
        if self.paused_at is None:
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
        """A step ended: its own time kept (its wall time less its waits and pauses)."""
        now = self.clock()
        self.owner = threading.get_ident()
        if self.last is not None and self.paused_at is None:
            own = now - self.last - self.waited - self.left_out
            self.steps.append(max(own, 0.0))
        self.last, self.waited, self.left_out = now, 0.0, 0.0
        if self.paused_at is not None:
            self.paused_at = now

    def restart(self) -> None:
        """A new attempt: nothing before counts, its figures start anew."""
        self.last, self.waited, self.left_out, self.paused_at = None, 0.0, 0.0, None
        self.steps.clear()

    # ---- the heartbeat's side -------------------------------------------------------------
    def own(self) -> float | None:
        """The median own time per step of the newest WINDOW steps; None before 3."""
        steps = list(self.steps)
        return statistics.median(steps) if len(steps) >= 3 else None

    # ---- DistributedDataParallel ----------------------------------------------------------
    def watch_ddp(self, module: Any) -> None:
        """Read ``module``'s (a DDP's) timers after each of its forwards, sampled every
        iteration: each iteration's gradient wait counts, however many a step has."""
        try:
            module._set_ddp_runtime_logging_sample_rate(1)
        except (AttributeError, RuntimeError):
            return          # a torch without DDP's timers: the wall-time measure stands
        if module not in self.ddps:
            self.ddps.add(module)
            module.register_forward_hook(lambda m, _in, _out: self._ddp_sampled(m))

    def _ddp_sampled(self, module: Any) -> None:
        """After a DDP's forward (it has logged the iteration before): that iteration's
        gradient wait, its buckets' communication after the backward's compute ended."""
        if _pace is not self or threading.get_ident() != self.owner:
            return
        try:
            data = module._get_ddp_logging_data()
        except (AttributeError, RuntimeError):
            return
        start = int(data.get("forward_compute_time_start", 0) or 0)
        if not start or self._ddp_sample.get(id(module)) == start:
            return
        self._ddp_sample[id(module)] = start
        comm_end = int(data.get("backward_comm_time_end", 0) or 0)
        compute_end = int(data.get("backward_compute_time_end", 0) or 0)
        if comm_end and compute_end:
            self.collective(max(comm_end - compute_end, 0) * NS)


_pace: Pace | None = None
# DDPs made since the watch was installed, before any Pace (a framework wraps the model
# before its callback attaches the runtime): the Pace installed next adopts them
_made: weakref.WeakSet[Any] = weakref.WeakSet()


def current() -> Pace | None:
    return _pace


def install(pace: Pace) -> Pace:
    """Make ``pace`` this process's: torch.distributed's waits and every
    DistributedDataParallel made from now on report to it (the patches are made once per
    process; a new attempt's reporter takes them over)."""
    global _pace
    _pace = pace
    time_waits()
    watch_new_ddps()
    for module in list(_made):
        pace.watch_ddp(module)
    return pace


def time_waits(on: bool = True) -> None:
    """Time every ``Work.wait()`` made from Python for the current Pace (``on``), or take
    the timing off again (``benchmarks/pace_bench.py`` compares the two)."""
    from torch._C import Future
    from torch._C._distributed_c10d import Work

    for kind in (Work, Future):      # a Work's wait, and its future's (work.get_future())
        wait = kind.wait
        timed = getattr(wait, "_hpctrain_timed", False)
        if on and not timed:
            kind.wait = _timed(wait)             # type: ignore[method-assign]
        elif not on and timed:
            kind.wait = wait.__wrapped__         # type: ignore[attr-defined]


def _timed(wait: Callable[..., Any]) -> Callable[..., Any]:
    """``Work.wait`` with the time of each call on the training loop's thread given to the
    current Pace."""
    compiling = _compiling_check()
    clock, ident = time.perf_counter, threading.get_ident

    @functools.wraps(wait)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        pace = _pace
        if pace is None or ident() != pace.owner or compiling():
            return wait(self, *args, **kwargs)
        start = clock()
        try:
            return wait(self, *args, **kwargs)
        finally:
            pace.collective(clock() - start)

    timed._hpctrain_timed = True     # type: ignore[attr-defined]
    return timed


def _compiling_check() -> Callable[[], bool]:
    """Are we inside torch.compile's tracing? There, no clock reads (they would break the
    graph). Looked up once: the wrapper runs on every wait."""
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
