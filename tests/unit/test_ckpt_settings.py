"""The spec drives the checkpoint manager (issue 43): in a job, ``CheckpointManager()``
takes the spec's ``[checkpoint]`` dir, keep_last, keep_every, striping and interval from
what the rendered script exports; an argument given wins; outside a job a manager without
a directory says what to pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain import protocol as p
from hpctrain.checkpoint import settings
from hpctrain.errors import CheckpointError, SpecError
from hpctrain.spec.checkpoint import CheckpointSpec
from helpers.ckpt import make_state

JOB = {p.CKPT_INTERVAL_STEPS: "4", p.CKPT_KEEP_LAST: "2"}   # every rendered job has these


def test_given_wins_then_the_spec_then_the_specs_defaults() -> None:
    env = {**JOB, p.CKPT_DIR: "/shared/ck", p.CKPT_KEEP_EVERY: "10", p.CKPT_STRIPE_COUNT: "-1"}
    assert settings.resolve(None, env=env) == settings.Settings(
        "/shared/ck", keep_last=2, keep_every=10, stripe_count=-1, interval_steps=4)
    assert settings.resolve("/mine", keep_last=5, keep_every=3, stripe_count=2,
                            interval_steps=7, env=env) == settings.Settings(
        "/mine", keep_last=5, keep_every=3, stripe_count=2, interval_steps=7)
    # outside a job: the defaults the spec has too
    defaults = CheckpointSpec()
    assert settings.resolve(Path("/x"), env={}) == settings.Settings(
        "/x", keep_last=defaults.keep_last, keep_every=defaults.keep_every,
        stripe_count=defaults.stripe_count, interval_steps=defaults.interval_steps)


def test_without_a_directory_the_error_says_what_to_pass() -> None:
    with pytest.raises(CheckpointError, match=r"^CheckpointManager\(\) has no directory: "
                       r"outside an hpctrain job .*\$HPCTRAIN_CKPT_DIR is not set\); pass one: "
                       r'CheckpointManager\("/shared/ckpt/run1", keep_last=3\)$'):
        settings.resolve(None, env={})
    with pytest.raises(CheckpointError, match=r"the job's spec has no \[checkpoint\] dir \(add "
                       r'dir = "/shared/ckpt/NAME" under \[checkpoint\]\), or pass one'):
        settings.resolve(None, env=JOB)
    with pytest.raises(CheckpointError, match=r"^HPCTRAIN_CKPT_KEEP_LAST='two' is not a "
                       "whole number: .*unset it or pass the value to CheckpointManager$"):
        settings.resolve("/x", env={p.CKPT_KEEP_LAST: "two"})
    with pytest.raises(CheckpointError, match=r"^interval_steps=0 must be a whole number >= 1"):
        settings.resolve("/x", interval_steps=0, env={})


def test_the_spec_checks_keep_every() -> None:
    assert CheckpointSpec.from_dict({"keep_every": 1000}).keep_every == 1000
    with pytest.raises(SpecError, match=r"^checkpoint.keep_every=0 is out of range: use 1 or "
                                        "more$"):
        CheckpointSpec.from_dict({"keep_every": 0})
    with pytest.raises(SpecError, match=r"checkpoint.keep_every='10' must be a whole number"):
        CheckpointSpec.from_dict({"keep_every": "10"})


@pytest.mark.torch
def test_a_manager_in_a_job_keeps_what_the_spec_says_and_saves_when_due(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """keep_last = 2 in the spec keeps 2 (the examples' hard-coded 3 kept 3), plus every
    keep_every-th; save_if_due saves every interval_steps."""
    from hpctrain.checkpoint import CheckpointManager

    for name, value in {**JOB, p.CKPT_DIR: str(tmp_path), p.CKPT_KEEP_EVERY: "8"}.items():
        monkeypatch.setenv(name, value)
    with CheckpointManager() as mgr:
        assert (mgr.root, mgr.keep_last, mgr.keep_every, mgr.interval_steps) == (
            tmp_path, 2, 8, 4)
        saved = [step for step in range(0, 21) if mgr.save_if_due(step, make_state(step))]
        assert saved == [4, 8, 12, 16, 20]
        assert [s.step for s in mgr.list()] == [8, 16, 20]
        assert not mgr.due(0) and mgr.due(24) and not mgr.due(25)
    with CheckpointManager(keep_last=5, interval_steps=10) as mgr:   # given: it wins
        assert (mgr.keep_last, mgr.keep_every, mgr.interval_steps) == (5, 8, 10)
