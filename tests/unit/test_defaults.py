"""The fault-tolerance defaults are written once (hpctrain.protocol.defaults): the spec
applies them to a table that leaves a key out, and the supervisor falls back on them when
the script exports nothing (run by hand). These pin that both sides give the same values."""

from __future__ import annotations

import dataclasses

import pytest

from hpctrain.protocol import defaults
from hpctrain.spec.model import RequeueSpec, WatchdogSpec
from hpctrain.spec.partitions import Partition
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision.budget import LIMIT_NAMES, Budget

BY_HAND = {"SLURM_JOB_ID": "7"}   # a supervisor run without the rendered script's exports


def config(**env: str) -> Config:
    return Config.from_env(["srun", "python", "train.py"], {**BY_HAND, **env})


def spec_limits(spec: RequeueSpec) -> dict[str, int | None]:
    return {cause: getattr(spec, name) for cause, name in LIMIT_NAMES.items()}


def supervisor_limits(cfg: Config) -> dict[str, int | None]:
    return {cause: cfg.budget.per_cause.get(cause) for cause in LIMIT_NAMES}


@pytest.mark.parametrize("table", [None, {}, {"max_requeues": 2}, {"max_requeues": 0},
                                   {"max_requeues": 50}])
def test_requeue_defaults_agree(table: dict | None) -> None:
    spec = RequeueSpec() if table is None else RequeueSpec.from_dict(table)
    env = {} if not table else {"HPCTRAIN_MAX_REQUEUES": str(table["max_requeues"])}
    cfg = config(**env)
    assert cfg.budget.max_requeues == spec.max_requeues
    assert supervisor_limits(cfg) == spec_limits(spec)
    assert cfg.requeue_signal == spec.signal


def test_max_crash_restarts_stays_optional_on_both_sides() -> None:
    """Left out, neither side has a number: the supervisor picks by the script's kind."""
    assert RequeueSpec().max_crash_restarts is None
    assert RequeueSpec.from_dict({}).max_crash_restarts is None
    assert "user_crash" not in config().budget.per_cause


def test_watchdog_and_health_check_defaults_agree() -> None:
    spec, cfg = WatchdogSpec.from_dict({}), config()
    assert spec == WatchdogSpec()
    assert cfg.max_step_restarts == spec.max_step_restarts == defaults.MAX_STEP_RESTARTS
    assert cfg.exclude_bad_nodes == spec.exclude_bad_nodes == defaults.EXCLUDE_BAD_NODES
    part = {f.name: f.default for f in dataclasses.fields(Partition)}
    assert cfg.health_check_timeout_s == part["health_check_timeout_s"] \
        == defaults.HEALTH_CHECK_TIMEOUT_S
    # the dataclasses' own defaults are the same numbers
    fields = {f.name: f.default for f in dataclasses.fields(Config)}
    assert fields["max_step_restarts"] == cfg.max_step_restarts
    assert fields["health_check_timeout_s"] == cfg.health_check_timeout_s
    assert Budget().max_requeues == RequeueSpec().max_requeues


def test_the_defaults_are_what_the_docs_say() -> None:
    """The numbers themselves (docs/spec.md, docs/fault-recovery.md): a change is a
    deliberate one."""
    assert (defaults.MAX_REQUEUES, defaults.CAPPED_CAUSE_LIMIT, defaults.MAX_STEP_RESTARTS,
            defaults.HEALTH_CHECK_TIMEOUT_S, defaults.REQUEUE_SIGNAL) == (10, 3, 2, 120, "USR2")
