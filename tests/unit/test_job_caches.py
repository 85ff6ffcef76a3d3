"""The job-private cache directory (where the container runtime mounts no home) goes when
the job ends for good (completed, failed, cancelled) and stays when it is requeued: the
supervisor driven through whole runs against the recorded stand-in of Slurm
(tests/helpers/fake_scheduler.py), and the rule that only hpctrain's own directory is
ever removed. The script's side (made, mounted, removed after a real run through the
stand-ins) is in tests/unit/test_container.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain import protocol as p
from hpctrain.supervisor import caches
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.run import Supervisor
from hpctrain.supervisor.watchdog import Limits
from helpers.fake_scheduler import KINDS, FakeSlurm
from helpers.supervise import BUDGET


def run_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events=(),
            steps=({},)) -> tuple[dict[str, str], Path]:
    """One run of the supervisor with a job cache made as the script makes it: (its
    verdict, the cache directory)."""
    cache = tmp_path / p.JOB_CACHE_DIR / "42"
    (cache / "triton_cache_dir").mkdir(parents=True)
    (cache / "triton_cache_dir" / "kernel.so").write_text("compiled")
    monkeypatch.setenv(p.JOB_CACHE, str(cache))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    kind = KINDS["srun"]
    fake = FakeSlurm(kind, tmp_path / "job.log", events, steps, restart_count=0,
                     outage=None, nodes=("n1",), time_limit_s=3600.0, world=2)
    config = Config(argv=("launcher",), key="42", restart_count=0, cluster="dev",
                    launcher=kind.launcher, requeue_signal="USR2", budget=BUDGET,
                    base=str(tmp_path), signal_lead_s=30, world=2, nodes=1, nodelist="n1",
                    job_nodes=1, limits=Limits(beat_s=2.0))
    supervisor = Supervisor(config, fake)
    fake.batch = supervisor.run_state.handler
    try:
        supervisor.run()
    finally:
        supervisor.close()
    return p.read_record(p.state_dir(tmp_path, "42") / p.OUTCOME), cache


@pytest.mark.parametrize("events, steps, cause", [
    ((), ({},), "completed"),
    (((4.0, "scancel"),), ({},), "cancelled"),
    ((), ({"crash_at": 3},), "user_crash")], ids=["completed", "cancelled", "failed"])
def test_the_job_cache_goes_when_the_job_ends_for_good(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        events: tuple, steps: tuple, cause: str) -> None:
    verdict, cache = run_job(tmp_path, monkeypatch, events, steps)
    assert verdict["cause"] == cause
    assert verdict["action"] == "finish", verdict

    assert not cache.exists() and not cache.parent.exists()
    assert f"removed the job's cache directory {cache}" in capsys.readouterr().err


@pytest.mark.parametrize("event", ["preempt", "warn"])
def test_a_requeued_job_keeps_its_cache_for_the_next_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, event: str) -> None:
    verdict, cache = run_job(tmp_path, monkeypatch, [(4.0, event)])
    assert verdict["action"] == "requeue", verdict
    assert (cache / "triton_cache_dir" / "kernel.so").read_text() == "compiled"


def test_only_hpctrains_own_directory_is_ever_removed(tmp_path: Path) -> None:
    own = tmp_path / ".hpctrain-cache" / "7"
    env = {p.JOB_CACHE: str(own), "SLURM_JOB_ID": "7"}
    assert caches.job_cache(env) == own
    for wrong in [str(tmp_path), str(tmp_path / "home"), str(tmp_path / ".hpctrain-cache"),
                  str(tmp_path / ".hpctrain-cache" / "8"), ".hpctrain-cache/7",
                  str(tmp_path / ".hpctrain-cache" / ".." / ".hpctrain-cache" / "7"), ""]:
        assert caches.job_cache({**env, p.JOB_CACHE: wrong}) is None, wrong
    assert caches.job_cache({p.JOB_CACHE: str(own)}) is None    # no job id: not a job
    # another job's cache beside it stays, and so does the folder holding it
    other = tmp_path / ".hpctrain-cache" / "8"
    other.mkdir(parents=True)
    own.mkdir()
    assert caches.drop(env, "requeue") is None and caches.drop(env, "leave") is None
    assert own.is_dir()
    assert "removed" in (caches.drop(env, "finish") or "")
    assert not own.exists() and other.is_dir()
    # a link where the directory should be is not followed
    own.symlink_to(other)
    note = caches.drop(env, "stop")
    assert note is not None and note.startswith("could not remove") and other.is_dir()
