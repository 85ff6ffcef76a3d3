"""The supervisor driven through a whole run against the recorded stand-in of Slurm, the
step and the clock (tests/helpers/fake_scheduler.py): what the supervisor-matrix tests share."""

from __future__ import annotations

from pathlib import Path

from hpctrain import protocol as p
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import Budget
from hpctrain.supervisor.run import Supervisor
from hpctrain.supervisor.watchdog import Limits
from helpers.fake_scheduler import KINDS, FakeSlurm

BUDGET = Budget(5, {"preemption": 5, "time_limit": 5, "node_fail": 3, "user_crash": 0,
                    "storage": 3, "hang": 3})


def supervise(tmp_path: Path, kind: str, *, events=(), steps=({},), restart_count: int = 0,
              outage: tuple[str, float] | None = None, allocation: tuple[str, ...] = ("n1",),
              time_limit_s: float = 3600.0, sacct_lag_s: float = 0.0,
              **cfg: object) -> tuple[int, FakeSlurm, dict[str, str], list[str]]:
    """One run of the supervisor: (its exit code, the stand-in, the verdict, the ledger)."""
    fake = FakeSlurm(KINDS[kind], tmp_path / "job.log", events, steps,
                     restart_count=restart_count, outage=outage, nodes=allocation,
                     time_limit_s=time_limit_s, sacct_lag_s=sacct_lag_s,
                     world=int(cfg.get("world", 2)))  # type: ignore[call-overload]
    config = Config(**{**dict(
        argv=("launcher",), key="42", restart_count=restart_count, cluster="dev",
        launcher=KINDS[kind].launcher, requeue_signal="USR2", budget=BUDGET,
        base=str(tmp_path), signal_lead_s=30, world=2, nodes=1, nodelist="n1", job_nodes=1,
        limits=Limits(beat_s=2.0)), **cfg})  # type: ignore[arg-type]
    supervisor = Supervisor(config, fake)
    fake.batch = supervisor.run_state.handler
    code = supervisor.run()
    state = p.state_dir(tmp_path, "42")
    ledger = (state / p.LEDGER).read_text().splitlines() if (state / p.LEDGER).exists() else []
    return code, fake, p.read_record(state / p.OUTCOME), ledger


def asked(fake: FakeSlurm, what: str) -> list[tuple[str, ...]]:
    return [c for c in fake.calls if c[0] == what]


# [elastic] spare nodes: 2 nodes x 2 ranks and a spare
SPARES = dict(allocation=("n1", "n2", "n3"), spare_nodes=1, nodes=2, world=4,
              nodelist="n1,n2,n3", job_nodes=3, batch_node="n1",
              argv=("srun", "--nodes=2", "--ntasks=4", "python", "train.py"),
              where="4 rank(s) on {nodes}, rendezvous n1:20042")
