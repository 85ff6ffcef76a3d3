"""A rank's own time per step (hpctrain.runtime.pace): the wall time of a step less its
waits in blocking collectives and its time in other phases; DDP's own timers when a DDP
ran; the median of the newest steps (one slow step moves it little)."""

from __future__ import annotations

import os

import pytest

from hpctrain.runtime.pace import WINDOW, Pace


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def steps(pace: Pace, clock: Clock, work: float, wait: float, n: int) -> None:
    for _ in range(n):
        clock.t += work + wait
        pace.collective(wait)
        pace.boundary()


def test_own_time_is_the_step_less_its_waits() -> None:
    clock = Clock()
    pace = Pace(clock)
    pace.boundary()                       # the first boundary starts the count
    steps(pace, clock, 0.10, 0.30, 2)
    assert pace.own() is None             # fewer than 3 steps: no figure yet
    steps(pace, clock, 0.10, 0.30, 4)
    assert pace.own() == pytest.approx(0.10)


def test_one_slow_step_a_save_and_a_pause_move_the_median_little() -> None:
    clock = Clock()
    pace = Pace(clock)
    pace.boundary()
    steps(pace, clock, 0.10, 0.0, WINDOW - 1)
    clock.t += 2.0                        # one step 20x slower (a GC pause)
    pace.boundary()
    pace.pause()                          # a save: 5 s outside any step
    clock.t += 5.0
    pace.resume()
    clock.t += 0.10
    pace.boundary()
    assert pace.own() == pytest.approx(0.10)


def test_a_new_attempt_starts_its_figures_anew() -> None:
    clock = Clock()
    pace = Pace(clock)
    pace.boundary()
    steps(pace, clock, 1.0, 0.0, 4)
    pace.restart()
    assert pace.own() is None             # the last attempt's figures say nothing of this one
    clock.t += 30.0                       # the restart itself: not a step
    pace.boundary()
    steps(pace, clock, 0.2, 0.0, 3)
    assert pace.own() == pytest.approx(0.2)


def test_a_wait_inside_a_pause_is_left_out_once() -> None:
    """A synchronous save's commit waits for the others while the phase is saving: that
    time is left out as the save's, not taken off the step a second time."""
    clock = Clock()
    pace = Pace(clock)
    pace.boundary()
    for _ in range(4):
        clock.t += 0.1                    # the step's own work
        pace.pause()
        clock.t += 0.3
        pace.collective(0.3)              # the save's barrier, inside the pause
        pace.resume()
        pace.boundary()
    assert pace.own() == pytest.approx(0.1)


@pytest.mark.torch
def test_a_ddps_own_timers_give_its_compute_not_its_wait() -> None:
    import torch
    import torch.distributed as dist

    from hpctrain.runtime import pace as pace_mod

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        pace_mod.watch_new_ddps()         # a framework's callback, imported first
        early = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
        pace = pace_mod.install(Pace())   # the runtime attached after the model was wrapped
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
        assert model in pace.ddps and early in pace.ddps
        pace.ddps.discard(early)
        pace.boundary()
        for _ in range(4):
            model(torch.randn(16, 64)).sum().backward()
            dist.all_reduce(torch.ones(1))     # its wait() timed as a wait
            pace.boundary()
        assert pace.own() is not None and 0 < pace.own() < 1.0
        from torch._C._distributed_c10d import Work
        assert Work.wait._hpctrain_timed
    finally:
        dist.destroy_process_group()
        pace_mod._pace = None


class FakeDDP:
    """What the measure reads of a DistributedDataParallel (a stand-in, the timers as DDP
    gives them: the iteration before's, in ns, read after a forward)."""

    def __init__(self) -> None:
        self.data: dict[str, int] = {}
        self.hooks: list = []
        self.n = 0

    def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
        pass

    def _get_ddp_logging_data(self) -> dict[str, int]:
        return dict(self.data)

    def register_forward_hook(self, hook) -> None:
        self.hooks.append(hook)

    def iteration(self, clock: Clock, compute: float, wait: float) -> None:
        """A forward (DDP logs the iteration before, the hooks read it), then this one's
        compute and its gradient wait."""
        for hook in self.hooks:
            hook(self, (), None)
        self.n += 1
        start = clock.t
        clock.t += compute
        computed = clock.t
        clock.t += wait
        self.data = {"forward_compute_time_start": int(start * 1e9) + self.n,
                     "backward_compute_time_end": int(computed * 1e9),
                     "backward_comm_time_end": int(clock.t * 1e9)}


def test_every_ddp_iteration_of_a_step_has_its_wait_taken_out() -> None:
    """stop_requested() every 4 iterations (or accumulation without no_sync): each
    iteration's 0.2 s gradient wait comes off the step, not only the newest one's."""
    from hpctrain.runtime import pace as pace_mod

    clock = Clock()
    pace = Pace(clock)
    ddp = FakeDDP()
    before, pace_mod._pace = pace_mod._pace, pace
    try:
        pace.watch_ddp(ddp)
        pace.boundary()
        for _ in range(6):
            for _ in range(4):
                ddp.iteration(clock, compute=0.1, wait=0.2)
            pace.boundary()
    finally:
        pace_mod._pace = before
    assert pace.own() == pytest.approx(0.4)      # 4 x 0.1 of compute
