"""``init()`` -> :class:`Context`: torch.distributed, the ("pp","dp","tp") mesh, stop signals.

torch is imported inside functions: importing hpctrain.runtime stays cheap and
torch-free (the supervisor reads its exit codes), only ``init()`` pays.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from hpctrain.protocol import COLLECTIVE_TIMEOUT_S, STEP_ATTEMPT, STOP_SIGNALS, env_int
from hpctrain.runtime import groups, pace, progress, teardown
from hpctrain.runtime.causes import BY_CODE, CAUSES, cause_of_stop
from hpctrain.runtime.crashrecord import install_excepthook, write_crash_record
from hpctrain.runtime.environment import Environment
from hpctrain.protocol.records import StopNotice
from hpctrain.runtime.exitrecord import ExitRecord, inferred_last_cause, read_record, write_record
from hpctrain.runtime.progress import Reporter
from hpctrain.runtime.signals import DEFAULT_SIGNALS, StopFlag, parse_signals
from hpctrain.runtime.work import make_work

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

MESH_DIMS = ("pp", "dp", "tp")
BETWEEN_STEPS = "between-steps"   # the phase of ctx.between_steps()
# a collective's wait for a peer when neither the caller nor the job says: the watchdog,
# not this, finds a hang; long enough for a rank-0-only preparation at start-up while the
# others wait in a barrier (torch's own default is 30 minutes)
DEFAULT_COLLECTIVE_S = 600.0


class Context:
    """A training process's view of the job; built by :func:`init`."""

    def __init__(self, env: Environment, device: torch.device, mesh: DeviceMesh | None,
                 flag: StopFlag, exit: teardown.Teardown,
                 reporter: Reporter | None = None, attempt: int = 0) -> None:
        self.env = env
        # restarts of the training step in this run so far: in new processes (a hang the
        # supervisor killed) or in these ones (hpctrain.runtime.run)
        self.attempt = attempt
        self.reporter = reporter  # progress for the supervisor's hang watchdog (or None)
        self.device = device
        self.mesh = mesh
        self.flag = flag
        self.stop_cause: str | None = None  # agreed cause once stop_requested() is True
        self._step: int | None = None
        self._exit = exit   # what close(), exit_for_requeue() and the process's exit run
        self.last_exit_cause: str | None = (
            env.last_exit_cause or inferred_last_cause(ExitRecord.parse(read_record(env.exit_file)),
                                                  env.restart_count))

    # -- where am I ---------------------------------------------------------------------
    rank = property(lambda self: self.env.rank)
    world_size = property(lambda self: self.env.world_size)
    local_rank = property(lambda self: self.env.local_rank)
    node_rank = property(lambda self: self.env.node_rank)
    restart_count = property(lambda self: self.env.restart_count)
    job_id = property(lambda self: self.env.job_id)
    tp_size = property(lambda self: self.env.tp)
    dp_size = property(lambda self: self.env.dp)
    pp_size = property(lambda self: self.env.pp)
    # the global batch kept after a shrink ([elastic] min_nodes): each rank takes this many
    # micro-batches a step (1 at full width); full_dp_size: the job's unshrunk dp
    accumulation = property(lambda self: self.env.accumulation)
    full_dp_size = property(lambda self: self.env.full_dp or self.env.dp)
    pp_rank = property(lambda self: self.env.coords[0])
    dp_rank = property(lambda self: self.env.coords[1])
    tp_rank = property(lambda self: self.env.coords[2])

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    def group(self, dim: str) -> Any:
        """The process group of mesh dimension ``dim`` ("pp", "dp" or "tp")."""
        if self.mesh is None:
            raise RuntimeError("this Context was attached to a framework's process group "
                               "(hpctrain.runtime.attach): it has no mesh; ask the framework "
                               "for its groups")
        return self.mesh.get_group(dim)

    # -- progress -----------------------------------------------------------------------
    @property
    def step(self) -> int | None:
        """The step in progress. Set it in the training loop (``ctx.step = n``): a crash
        record names it, and the hang watchdog sees the job advance."""
        return self._step

    @step.setter
    def step(self, value: int | None) -> None:
        self._step = value
        if self.reporter is not None:
            self.reporter.set_step(value)

    def set_work(self, *, tokens: float | None = None, samples: float | None = None,
                 flops_per_token: float | None = None, flops_per_sample: float | None = None,
                 params: float | None = None) -> None:
        """What one optimizer step does, every rank's together: ``tokens`` (global batch x
        sequence length) or ``samples``; the model's FLOPs per token (or sample), or its
        ``params`` (6 FLOPs per parameter and token to train), else the spec's ``[model]
        params``. ``hpctrain report`` measures throughput, MFU and cost from it. Call it
        before the loop (again when it changes); ValueError for a value that is not one."""
        work = make_work(tokens=tokens, samples=samples, flops_per_token=flops_per_token,
                         flops_per_sample=flops_per_sample, params=params,
                         spec_params=self.env.model_params, mode=self.env.model_mode)
        if self.reporter is not None:
            self.reporter.set_work(work)

    # -- stopping -----------------------------------------------------------------------
    def stop_requested(self) -> bool:
        """Collective (call on every rank at the same step boundary): True on all ranks
        once any rank received a stop signal. The most urgent cause wins (all_reduce MAX)
        and is kept in :attr:`stop_cause`. Each call is also progress for the watchdog."""
        import torch
        import torch.distributed as dist

        if self.reporter is not None:
            self.reporter.boundary()   # before the collective: a rank that never gets here
        local = 0                      # is the one the others wait for
        if self.flag:
            notice = StopNotice.parse(read_record(self.env.stop_file))
            local = cause_of_stop(self.flag.signum, notice, self.env.restart_count, now=self.flag.received_at,
                                  end_time=self.env.job_end_time,
                                  lead_s=self.env.signal_lead_s, run_id=self.env.run_id).code
        code = local
        if dist.is_initialized():    # (attach() to a one-process run: no group to ask)
            agreed = torch.tensor([local], dtype=torch.int64, device=self.device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            code = int(agreed.item())
        if code:
            self.stop_cause = BY_CODE[code].name
        return code != 0

    @contextmanager
    def between_steps(self) -> Iterator[None]:
        """Mark work between training steps that takes much longer than a step (an
        evaluation pass, reloading a dataset): the watchdog then allows it the whole hang
        timeout (``hang_timeout_s``, 300 s by default) instead of the timeout it derives
        from the step time, and the step time is not skewed by it."""
        with progress.phase(BETWEEN_STEPS):
            yield

    def exit_for_requeue(self, step: int | None = None, cause: str | None = None) -> NoReturn:
        """Leave so the supervisor requeues the job: call on every rank AFTER the
        emergency checkpoint. Waits for all ranks (a launcher kills the others as soon as
        one rank exits), rank 0 writes the exit record, then exits with the cause's code
        (see :func:`_exit_with`: always that code, never an abort at interpreter exit)."""
        import torch.distributed as dist

        name = cause or self.stop_cause
        row = CAUSES.get(name or "")
        if row is None or not row.requeue or row.exit_code is None:
            raise ValueError(f"exit_for_requeue(cause={name!r}): call it after stop_requested() "
                             "returned True, or pass cause='preemption' or 'time_limit'")
        self._exit.mark("requeue")
        if self.reporter is not None:
            self.reporter.set_phase("exiting")
        # an async emergency save still needs the process group: let it finish first
        from hpctrain.checkpoint.open_managers import close_all

        close_all()
        if dist.is_initialized():
            dist.barrier()
        if self.is_main and self.env.exit_file:
            write_record(self.env.exit_file, ExitRecord(
                cause=row.name, exit_code=row.exit_code, requeue=True, step=step,
                restart_count=self.env.restart_count, job_id=self.env.job_id or "",
                run_id=self.env.run_id or "", node=self.env.node or "").fields())
        self.close()
        _exit_with(row.exit_code)

    def record_crash(self, exc_type: type[BaseException], exc: BaseException) -> bool:
        """Leave a ``cause=user_crash`` exit record for an uncaught exception (any rank,
        first one wins, never over this run's requeue record); never raises."""
        self._exit.mark("crash")
        return write_crash_record(self.env.exit_file, exc_type, exc, step=self.step,
                                  restart_count=self.env.restart_count,
                                  job_id=self.env.job_id, rank=self.env.rank,
                                  node=self.env.node, run_id=self.env.run_id,
                                  at_step=progress.position())

    def close(self) -> None:
        """Leave cleanly: every checkpoint manager's in-flight save made durable and its
        lock released, then the process group destroyed (if init made it). Runs once
        (later calls do nothing), and by itself at the process's exit: a script need not
        call it (:mod:`hpctrain.runtime.teardown`). Stop signals stay routed to the flag
        until the process ends, so a late SIGTERM cannot kill a rank mid-exit."""
        self._exit.run()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exit_with(code: int) -> NoReturn:
    """Exit with ``code`` for certain. Do what a normal exit does for Python (join
    non-daemon threads, run atexit handlers such as the checkpoint manager's flush of an
    async save, flush stdio), then leave without C++ static destructors: there, a torch
    gloo/TCPStore thread can still abort the process ("terminate called without an active
    exception", seen once in CI as SIGABRT), and the supervisor would read 134, not 76."""
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclass
class Setup:
    """What a rank sets up once, before any process group: where it is, its stop flag,
    its progress reporter and its device. :func:`init` and :func:`hpctrain.runtime.run`
    build it the same way."""

    env: Environment
    environ: Mapping[str, str]
    flag: StopFlag
    reporter: Reporter | None
    device: torch.device
    backend: str
    current: Context | None = None     # the attempt's context (the crash hook's)

    @classmethod
    def make(cls, backend: str | None, signals: Iterable[int] | None,
             env: Mapping[str, str] | None) -> Setup:
        import torch

        environ = os.environ if env is None else env
        parsed = Environment.from_env(environ)
        if signals is None:
            raw = environ.get(STOP_SIGNALS)
            signals = parse_signals(raw) if raw else DEFAULT_SIGNALS
        # Install first: a signal arriving during the (slow) rendezvous is kept, not fatal.
        flag = StopFlag().install(signals)
        # Report start-up before the rendezvous: a rank that never arrives is then told
        # apart from those waiting for it.
        reporter = progress.start_from_env(environ, parsed.rank, parsed.node)
        if reporter is not None:   # its collectives' waits and DDP's timers (own time per step)
            pace.install(reporter.pace)
        use_cuda = torch.cuda.is_available() and backend != "gloo"
        device = torch.device("cuda", parsed.local_rank % torch.cuda.device_count()) \
            if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)
        import torch.distributed as dist

        if dist.is_available() and not dist.is_initialized():
            groups.preload()   # before the first group: else a module import pins it
        setup = cls(parsed, environ, flag, reporter, device,
                    backend or ("nccl" if use_cuda else "gloo"))
        # an uncaught exception ends the job FAILED (not requeued); say why in the record
        install_excepthook(setup.record_crash)
        return setup

    def record_crash(self, exc_type: type[BaseException], exc: BaseException) -> bool:
        if self.current is None:
            # between two attempts (hpctrain.runtime.run): the attempt's Context is gone,
            # but the process's last word must still say its work did not end in a return
            teardown.mark("crash")
            return False
        return self.current.record_crash(exc_type, exc)

    def collective_timeout(self, timeout_s: float | None) -> timedelta:
        """How long one collective waits for a peer: ``timeout_s`` if given, else the job's
        ``$HPCTRAIN_COLLECTIVE_TIMEOUT_S`` (the spec's ``collective_timeout_s``, when it
        gives one), else DEFAULT_COLLECTIVE_S."""
        if timeout_s is None:
            raw = self.environ.get(COLLECTIVE_TIMEOUT_S, "")
            timeout_s = float(raw) if raw.isdigit() and int(raw) > 0 else \
                DEFAULT_COLLECTIVE_S
        return timedelta(seconds=timeout_s)

    def context(self, owns_process_group: bool, attempt: int = 0) -> Context:
        """The Context over the process group now initialised, with its mesh."""
        from torch.distributed.device_mesh import init_device_mesh

        e = self.env
        mesh = init_device_mesh(self.device.type, (e.pp, e.dp, e.tp), mesh_dim_names=MESH_DIMS)
        # what was set up, torn down at every exit (close, exit_for_requeue, the interpreter's)
        exit = teardown.install(self.reporter, e.rank, owns_process_group)
        self.current = Context(e, self.device, mesh, self.flag, exit, self.reporter, attempt)
        return self.current


def init(*, backend: str | None = None, signals: Iterable[int] | None = None,
         env: Mapping[str, str] | None = None, timeout_s: float | None = None) -> Context:
    """Read the environment, route stop signals to a flag, initialise torch.distributed
    (nccl with GPUs, gloo without) and a DeviceMesh with dims ("pp", "dp", "tp").

    Signals: ``signals`` or ``$HPCTRAIN_STOP_SIGNALS`` (e.g. ``USR2,TERM``), else USR2+TERM.
    ``timeout_s``: how long a collective waits for a peer (see :meth:`Setup.collective_timeout`).
    For restarts inside the running processes, use :func:`hpctrain.runtime.run` instead.
    """
    import torch.distributed as dist

    setup = Setup.make(backend, signals, env)
    parsed, environ = setup.env, setup.environ
    owns = not dist.is_initialized()
    if owns:
        # Under torchrun MASTER_ADDR/PORT point at the agent's store: use env://.
        # Under plain srun build the address from the nodelist instead.
        launched = "MASTER_ADDR" in environ and "MASTER_PORT" in environ
        method = "env://" if launched else f"tcp://{parsed.master_addr}:{parsed.master_port}"
        dist.init_process_group(setup.backend, init_method=method, rank=parsed.rank,
                                world_size=parsed.world_size,
                                timeout=setup.collective_timeout(timeout_s))
    return setup.context(owns, attempt=_attempt(environ))


def attach(*, signals: Iterable[int] | None = None,
           env: Mapping[str, str] | None = None) -> Context:
    """The runtime over a process group a framework made (Lightning, the Hugging Face
    Trainer, Accelerate): stop signals routed to the flag, progress for the watchdog, the
    exit records and :meth:`Context.stop_requested`'s agreement on the default group. It
    makes no process group and no mesh (``ctx.group`` is unavailable) and leaves the
    group's teardown to the framework; a one-process run needs no group. Signals as
    :func:`init`."""
    import torch.distributed as dist

    grouped = dist.is_initialized()
    setup = Setup.make(str(dist.get_backend()) if grouped else None, signals, env)
    if not grouped and setup.env.world_size > 1:
        raise RuntimeError(f"hpctrain.runtime.attach(): rank {setup.env.rank} of "
                           f"{setup.env.world_size} has no torch.distributed process group yet; "
                           "attach once the framework has set it up (its training has "
                           "begun), or use hpctrain.runtime.init()")
    exit = teardown.install(setup.reporter, setup.env.rank, owns_process_group=False)
    setup.current = Context(setup.env, setup.device, None, setup.flag, exit, setup.reporter,
                            _attempt(setup.environ))
    return setup.current


def _attempt(environ: Mapping[str, str]) -> int:
    """This run's in-allocation attempt (the supervisor's count; 0 when unset or garbled)."""
    return max(0, env_int(environ, STEP_ATTEMPT, 0, error=None))
