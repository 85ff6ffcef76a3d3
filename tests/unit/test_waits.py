"""Every wait inside the supervisor's step loop (hpctrain.supervisor.waits): one deadline,
stop signals taken between looks, over as soon as its condition holds or the step ends.
The view of an attempt (Watch) never waits itself."""

from __future__ import annotations

import ast
import inspect

from hpctrain.supervisor import hang
from hpctrain.supervisor.waits import Waiter


class Clock:
    """The scheduler's clock as the waits use it: a fake one that sleeps instantly."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Step:
    def __init__(self, ends_at: float | None, clock: Clock) -> None:
        self.ends_at, self.clock = ends_at, clock

    def poll(self) -> int | None:
        return 0 if self.ends_at is not None and self.clock.now >= self.ends_at else None


def test_a_wait_takes_signals_between_looks_and_ends_when_its_condition_holds() -> None:
    clock, pumped = Clock(), []
    waiter = Waiter(clock, lambda: pumped.append(clock.now))   # type: ignore[arg-type]
    assert waiter.until(lambda: clock.now >= 2.0, 15.0, 0.5)
    assert clock.now == 2.0 and pumped == [0.0, 0.5, 1.0, 1.5]


def test_a_wait_ends_at_its_deadline_or_when_the_step_ends() -> None:
    clock = Clock()
    waiter = Waiter(clock)   # type: ignore[arg-type]
    assert not waiter.until(lambda: False, 3.0, 0.5) and clock.now == 3.0
    clock.now = 0.0
    step: Step = Step(1.2, clock)
    assert not waiter.until(lambda: False, 15.0, 0.5, step)   # type: ignore[arg-type]
    assert clock.now == 1.5
    # the step's end is looked at before the condition: nothing more will come from it
    assert not waiter.until(lambda: True, 15.0, 0.5, step)   # type: ignore[arg-type]


def test_the_view_of_an_attempt_never_sleeps() -> None:
    """Watch is a view: a wait in it would hold signals back (the waits live in
    response, inprocess and gather, each a Waiter)."""
    tree = ast.parse(inspect.getsource(hang))
    calls = [n.func.attr for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert "sleep" not in calls
