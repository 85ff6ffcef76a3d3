"""The supervisor's one seam to the world outside its files: Slurm, the training step's
process and the clock.

:class:`Scheduler` is the interface the supervisor is written against; :class:`Slurm` is
the real one (``hpctrain.slurm.control`` for Slurm, a child process for the step, the
``time`` module for the clock). A test passes a recorded stand-in with the same methods
(tests/helpers/fake_scheduler.py) and drives :meth:`Supervisor.run
<hpctrain.supervisor.run.Supervisor.run>` through a whole job in milliseconds, on a clock
of its own; the devcluster tests prove the stand-in tells the truth.
"""

from __future__ import annotations

import threading
import time as clock
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from hpctrain.errors import SlurmError
from hpctrain.slurm import control
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.step import Step

RETRY_S = 2.0        # how often an unreachable controller is asked again
PROBES_AT_ONCE = 16  # nodes asked for a step at the same time (each its own srun)
T = TypeVar("T")


class StepProcess(Protocol):
    """A running training step (the launcher: srun ..., as the batch step's child)."""

    def poll(self) -> int | None:
        """The exit status once it ended (128+N when signal N killed it), else None."""

    def kill_local(self, signal_name: str) -> None:
        """Signal the local launcher process directly."""


class NodeAnswers(Protocol):
    """Nodes being asked for a step (:meth:`Scheduler.probe_nodes`)."""

    nodes: tuple[str, ...]

    def answers(self) -> dict[str, str | None]:
        """Wait for every node's answer: {node: None if it answered, else what srun
        said}."""


class Scheduler(Protocol):
    """What the supervisor needs from Slurm, from the operating system and from the clock.
    Slurm's errors come as :class:`hpctrain.errors.SlurmError` (``control.is_unreachable``
    tells a controller that did not answer from a refusal)."""

    # ---- Slurm: one job ----------------------------------------------------------------
    def show_job(self, key: str) -> JobView | None: ...
    def run_states(self, key: str) -> list[str]: ...
    def requeue(self, key: str) -> str: ...
    def forbid_requeue(self, key: str) -> None: ...
    def signal_steps(self, key: str, signal_name: str) -> None: ...
    def step_ids(self, key: str) -> list[str]: ...
    def kill_steps(self, key: str) -> list[str]: ...
    def set_excluded(self, key: str, nodes: list[str]) -> None: ...
    def set_nodes(self, key: str, count: int) -> None: ...
    def shrink_job(self, key: str, nodes: list[str]) -> None: ...

    # ---- Slurm: nodes --------------------------------------------------------------------
    def node_states(self, nodes: list[str]) -> dict[str, str]: ...
    def partition_nodes(self, partition: str) -> list[str]: ...
    def run_on_nodes(self, argv: list[str], nodes: int, timeout: float) -> str: ...
    def run_on(self, argv: list[str], nodes: list[str], timeout: float) -> str: ...
    def probe_nodes(self, nodes: list[str], timeout: float) -> NodeAnswers:
        """Start asking each of ``nodes`` for a step (through its slurmd)."""

    # ---- the step and the clock ------------------------------------------------------------
    def start_step(self, argv: Sequence[str], env: Mapping[str, str]) -> StepProcess: ...
    def time(self) -> float: ...
    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class Slurm:
    """The real :class:`Scheduler`."""

    show_job = staticmethod(control.show_job)
    run_states = staticmethod(control.run_states)
    requeue = staticmethod(control.requeue)
    forbid_requeue = staticmethod(control.forbid_requeue)
    signal_steps = staticmethod(control.signal_steps)
    step_ids = staticmethod(control.step_ids)
    kill_steps = staticmethod(control.kill_steps)
    set_excluded = staticmethod(control.set_excluded)
    set_nodes = staticmethod(control.set_nodes)
    shrink_job = staticmethod(control.shrink_job)
    node_states = staticmethod(control.node_states)
    partition_nodes = staticmethod(control.partition_nodes)
    time = staticmethod(clock.time)
    monotonic = staticmethod(clock.monotonic)
    sleep = staticmethod(clock.sleep)

    @staticmethod
    def run_on_nodes(argv: list[str], nodes: int, timeout: float) -> str:
        return control.run_on_nodes(argv, nodes, timeout=timeout)

    @staticmethod
    def run_on(argv: list[str], nodes: list[str], timeout: float) -> str:
        return control.run_on_nodes(argv, len(nodes), timeout=timeout, nodelist=nodes)

    @staticmethod
    def probe_nodes(nodes: list[str], timeout: float) -> Probe:
        return Probe(nodes, timeout)

    @staticmethod
    def start_step(argv: Sequence[str], env: Mapping[str, str]) -> Step:
        return Step(argv, env)


class Probe:
    """Nodes asked for a step in the background (``control.probe_node``), each at once (a
    rack's loss is many nodes, each a MessageTimeout to fail), so that the supervisor waits
    for Slurm's word on the failed step meanwhile. Daemon threads: a supervisor that no
    longer needs the answers (a stop signal came first) exits without waiting for them."""

    def __init__(self, nodes: Sequence[str], timeout: float) -> None:
        self.nodes = tuple(nodes)
        self._said: dict[str, str | None] = {}
        self._error: SlurmError | None = None
        groups = [self.nodes[i::PROBES_AT_ONCE]
                  for i in range(min(len(self.nodes), PROBES_AT_ONCE))]
        self._threads = [threading.Thread(target=self._ask, args=(group, timeout),
                                          name="hpctrain-probe", daemon=True)
                         for group in groups]
        for thread in self._threads:
            thread.start()

    def _ask(self, nodes: Sequence[str], timeout: float) -> None:
        for node in nodes:
            try:
                self._said[node] = control.probe_node(node, timeout=timeout)
            except SlurmError as exc:      # (srun could not be run at all)
                self._error = exc

    def answers(self) -> dict[str, str | None]:
        for thread in self._threads:
            thread.join()
        if self._error is not None:
            raise self._error
        return {node: self._said[node] for node in self.nodes}


def answered(slurm: Scheduler, call: Callable[[], T], what: str,
             deadline_s: float) -> tuple[bool, T | None]:
    """``(True, call())``, retrying for up to ``deadline_s`` while the controller does not
    answer (a failover, a restart); ``(False, None)`` once it gives up or Slurm refuses."""
    end = slurm.monotonic() + deadline_s
    told = False
    while True:
        try:
            return True, call()
        except SlurmError as exc:
            if slurm.monotonic() >= end or not control.is_unreachable(exc):
                say(f"{what} failed: {exc}")
                return False, None
            if not told:
                say(f"{what}: the controller does not answer ({exc}); trying again for up "
                    f"to {deadline_s:.0f} s")
                told = True
            slurm.sleep(RETRY_S)
