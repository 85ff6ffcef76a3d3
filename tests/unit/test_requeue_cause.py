"""Why Slurm requeued a run, when it did so before the supervisor could (row
slurm-requeued): somebody's ``scontrol requeue`` is never called a node failure because a
node the job gave back earlier is down, nor a preemption because the runtime took its TERM
for one; a node of the step lost is named even while sacct says nothing (accounting off,
or slurmdbd behind). From an adversarial run against the sacct-lag fix (2026-11-29)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hpctrain import protocol as p
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.run import Supervisor
from hpctrain.supervisor.watchdog import Limits
from helpers.fake_scheduler import KINDS, FakeSlurm
from helpers.supervise import BUDGET, SPARES

# the runtime's step killed by srun on a TERM before a word of its own (exit 143)
KINDS = {**KINDS, "rt143": replace(KINDS["runtime"], name="rt143",
                                   stop_code=lambda sig, cause: 143)}
NO_SPARE = {**SPARES, "spare_nodes": 0, "allocation": ("n1", "n2"), "nodelist": "n1,n2",
            "job_nodes": 2}


class AdminFake(FakeSlurm):
    """+ event ``admin_requeue`` (``_term``: the steps get a TERM, else a KILL): somebody's
    ``scontrol requeue``; sacct then says REQUEUED for that run, or nothing at all when
    accounting is off."""

    accounting: bool = True
    admin: list[float] | None = None

    def _play(self, what: str) -> None:
        if not what.startswith("admin_requeue"):
            super()._play(what)
            return
        self.admin = (self.admin or []) + [self.now]
        for step in self.started:
            if step.status is None:
                step.signal("TERM" if what.endswith("term") else "KILL")
        self._slurm_requeues()
        self._due.sort()

    def run_states(self, key: str) -> list[str]:
        states = super().run_states(key)
        if not self.accounting:
            return []
        for n, _ in enumerate(self.admin or []):
            i = self.restart_count + n
            if i < len(states) and states[i] != "RUNNING":
                states[i] = "REQUEUED"
        return states


def run(tmp_path: Path, kind: str, events, *, accounting: bool = True, lag: float = 0.0,
        steps=({},), **cfg) -> tuple[dict[str, str], list[str]]:
    """One supervised run: (its verdict, its ledger)."""
    fake = AdminFake(KINDS[kind], tmp_path / "job.log", events, steps,
                     nodes=cfg.pop("allocation", ("n1",)), sacct_lag_s=lag,
                     world=int(cfg.get("world", 2)))
    fake.accounting = accounting
    config = Config(**{**dict(
        argv=("launcher",), key="42", restart_count=0, cluster="dev",
        launcher=KINDS[kind].launcher, requeue_signal="USR2", budget=BUDGET,
        base=str(tmp_path), signal_lead_s=30, world=2, nodes=1, nodelist="n1", job_nodes=1,
        limits=Limits(beat_s=2.0)), **cfg})
    supervisor = Supervisor(config, fake)
    fake.batch = supervisor.run_state.handler
    supervisor.run()
    state = p.state_dir(tmp_path, "42")
    ledger = (state / p.LEDGER).read_text().splitlines() if (state / p.LEDGER).exists() else []
    return p.read_record(state / p.OUTCOME), ledger


@pytest.mark.parametrize("accounting,lag", [(True, 0.0), (False, 0.0), (True, 30.0)])
def test_somebodys_requeue_after_a_node_went_to_the_spare_is_a_requeue(
        tmp_path: Path, accounting: bool, lag: float) -> None:
    """n2 lost at 5 s and given back (the run goes on on n1,n3; Slurm marks n2 down); at
    60 s somebody requeues the job. sacct says REQUEUED, or nothing (off, 30 s behind)."""
    verdict, ledger = run(tmp_path, "rt143", [(5.0, "lose:n2"), (60.0, "admin_requeue")],
                          accounting=accounting, lag=lag, steps=[{"steps": 200}], **SPARES)
    assert verdict["cause"] == "requeued", (verdict, ledger)


def test_a_plain_scripts_requeue_after_a_node_died_is_a_requeue(tmp_path: Path) -> None:
    """A plain srun script (dies of the TERM: 143) loses n2 at 5 s (asked, no answer: given
    back); at 60 s somebody's requeue, accounting off."""
    verdict, ledger = run(tmp_path, "srun", [(5.0, "die:n2"), (60.0, "admin_requeue_term")],
                          accounting=False, steps=[{"steps": 400}], **SPARES)
    assert verdict["cause"] == "requeued", (verdict, ledger)


def test_the_runtime_taking_somebodys_requeue_for_a_preemption_gives_way_to_sacct(
        tmp_path: Path) -> None:
    """The runtime reads a TERM without a stop notice as a preemption (exit 75); sacct says
    REQUEUED (a preemption would be PREEMPTED): Slurm's fact wins."""
    verdict, ledger = run(tmp_path, "runtime", [(10.0, "admin_requeue_term")],
                          steps=[{"steps": 200}])
    assert verdict["cause"] == "requeued", (verdict, ledger)


def test_a_preemption_while_a_node_is_lost_is_a_preemption(tmp_path: Path) -> None:
    verdict, ledger = run(tmp_path, "rt143", [(5.0, "lose:n2"), (5.5, "preempt")], lag=60.0,
                          steps=[{"steps": 200}], **SPARES)
    assert verdict["cause"] == "preemption", (verdict, ledger)


def test_a_node_of_the_step_lost_all_at_once_without_accounting_is_a_node_failure(
        tmp_path: Path) -> None:
    """No spare: Slurm marks n2 down and requeues the job; sacct says nothing."""
    verdict, ledger = run(tmp_path, "rt143", [(5.0, "lose:n2")], accounting=False,
                          steps=[{"steps": 60}], **NO_SPARE)
    assert verdict["cause"] == "node_fail", (verdict, ledger)
