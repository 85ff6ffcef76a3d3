"""hpctrain.runtime.run without a scheduler: two ranks (their own processes, as srun starts
them) restart their attempt in the same processes after a crash on one rank and after an
interrupted hang, as a stand-in of the supervisor answers the protocol's records
(tests/helpers/standin_supervisor.py; the devcluster runs the real supervisor:
tests/cluster/test_inprocess_cluster.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpctrain import protocol as p
from helpers.standin_supervisor import StandIn, records
from helpers.torchrun import env_for, start_ranks, wait_ranks

pytestmark = [pytest.mark.torch, pytest.mark.slow]
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
RUN = {"HPCTRAIN_RUN_ID": "r1", "HPCTRAIN_RESTART_COUNT": "0", "SLURM_RESTART_COUNT": "0"}


def events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# The word of a rank freed from a collective by its peer's failure: gloo's "Connection
# closed by peer" or the supervisor's interrupt, whichever reaches it first (CI saw both).
FREED = ("peer", "interrupted")


def test_a_crash_and_a_hang_restart_in_the_same_processes(tmp_path: Path) -> None:
    state, ckpt, log = tmp_path / "s", tmp_path / "ckpt", tmp_path / "events.jsonl"
    state.mkdir()
    ckpt.mkdir()
    env = env_for(HPCTRAIN_STATE_DIR=str(state), HPCTRAIN_EXIT_FILE=str(state / p.EXIT),
                  HPCTRAIN_HEARTBEAT_S="0.2", **RUN)
    stand_in = StandIn(state, 2)
    procs = start_ranks(PROGRAMS / "allreduce_steps.py", 2, env, tmp_path / "out.txt", (
        "--inprocess", "--steps", "8", "--save-every", "2", "--step-sleep", "0.1",
        "--ckpt-dir", str(ckpt), "--events", str(log),
        "--crash", "1:3:0",        # attempt 0: rank 1 raises in step 3
        "--hang", "0:5:1"))        # attempt 1: rank 0 sleeps forever in step 5
    try:
        # attempt 1 reaches its hang: rank 0 never joins step 5's all-reduce
        deadline = time.monotonic() + 90
        while not any(e.get("attempt") == 1 and e.get("step") == 4 for e in events(log)):
            alive = all(proc.poll() is None for proc in procs)
            assert alive and time.monotonic() < deadline, \
                (tmp_path / "out.txt").read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(1.0)
        stand_in.interrupt()
    finally:
        codes = wait_ranks(procs, timeout=90)   # kills what is left on a failure
        stand_in.done.set()
    out = (tmp_path / "out.txt").read_text()
    assert codes == [0, 0], out[-3000:]
    found = events(log)
    starts = [e for e in found if e["event"] == "start"]
    # three attempts in one process each: the same pid, resumed where the last save was
    assert [s["attempt"] for s in starts] == [0, 1, 2] and len({s["pid"] for s in starts}) == 1
    assert [s["step"] for s in starts] == [0, 2, 4]
    # attempt 0: rank 1 crashed, its peer was freed: it lost its peer or was interrupted
    # first, whichever came sooner (not a crash of its own); attempt 1: every rank interrupted
    (_, _, first), (_, _, second) = stand_in.answered
    assert first[0] == "crash" and first[1] in FREED, first
    assert second == ["interrupted", "interrupted"]
    # every step of the last attempt ran; the program checked w == 8 * 2 on every rank
    assert [e["step"] for e in found if e["event"] == "step" and e["attempt"] == 2] == \
        [4, 5, 6, 7]
    assert any(e["event"] == "done" for e in found)
    # the crash was recorded by the rank that raised, then cleared for the next attempt
    assert "RuntimeError: simulated crash at step 3" in out
    # from the go to the next attempt's first step: a rendezvous and a load, no import
    for attempt, answered_at, _ in stand_in.answered:
        first = min(e["time"] for e in found if e["event"] == "step"
                    and e["attempt"] == attempt)
        assert first - answered_at < 3.0, (attempt, first - answered_at)
    assert records(state, 2)[0]["inprocess"] == "1"


def plain_loop(tmp_path: Path, world: int, answer: str, *faults: str,
               steps: int = 12) -> tuple[StandIn, list[int], list[dict], str, Path]:
    """tests/programs/plain_dp_loop.py on ``world`` ranks (their own processes, as srun
    starts them) with a stand-in supervisor answering ``answer``; collectives may wait
    60 s, so only a peer's closed connections end a wait sooner."""
    state, ckpt, log = tmp_path / "s", tmp_path / "ckpt", tmp_path / "events.jsonl"
    state.mkdir()
    ckpt.mkdir()
    env = env_for(HPCTRAIN_STATE_DIR=str(state), HPCTRAIN_EXIT_FILE=str(state / p.EXIT),
                  HPCTRAIN_HEARTBEAT_S="0.2", HPCTRAIN_COLLECTIVE_TIMEOUT_S="60", **RUN)
    stand_in = StandIn(state, world, answer)
    args = ["--steps", str(steps), "--save-every", "4", "--ckpt-dir", str(ckpt),
            "--events", str(log), "--final", str(tmp_path / "final")]
    procs = start_ranks(PROGRAMS / "plain_dp_loop.py", world, env, tmp_path / "out.txt",
                        (*args, *(w for f in faults for w in ("--fault", f))))
    try:
        codes = wait_ranks(procs, timeout=45)
    finally:
        stand_in.done.set()
    return stand_in, codes, events(log), (tmp_path / "out.txt").read_text(), state


def test_the_plainest_dp_loop_restarts_in_place_after_a_crash_just_after_a_save(
        tmp_path: Path) -> None:
    """Issue 41: ``all_reduce`` on the default group, a DeviceMesh made by the runtime, a
    crash just after a save. The default group of attempt 0 was pinned by
    torch.distributed.nn.functional's default arguments (imported lazily, after the group
    existed): the crashed rank's connections never closed and its peer waited in the
    all-reduce until its collective timeout (60 s here) instead of failing at once."""
    stand_in, codes, found, out, _ = plain_loop(tmp_path, 2, "go", "crash@4:1:0")
    assert codes == [0, 0], out[-3000:]
    (attempt, answered_at, words), = stand_in.answered
    assert words[0] == "crash" and words[1] in FREED, words
    starts = [e for e in found if e["event"] == "start"]
    assert [(s["attempt"], s["step"]) for s in starts] == [(0, 0), (1, 4)], starts
    crashed_at = min(e["time"] for e in found if e["event"] == "step" and e["step"] == 3)
    assert answered_at - crashed_at < 10.0, "the peer left the all-reduce at once"
    assert "a destroyed process group is still referenced" not in out, out[-3000:]
    assert any(e["event"] == "done" for e in found)


def test_ranks_told_to_stop_leave_with_a_last_word_that_is_not_a_return(
        tmp_path: Path) -> None:
    """The false COMPLETED of issue 41: ranks told to stop let their exception go on, and
    the crash hook (its attempt's Context already gone) no longer marked the exit: the
    teardown said ``exit=return``, and a rank dying at exit made the job COMPLETED."""
    stand_in, codes, found, out, state = plain_loop(tmp_path, 2, "stop", "crash@4:1:0")
    assert codes == [1, 1], out[-3000:]
    assert len(stand_in.answered) == 1
    last = records(state, 2)
    assert [r.get("exit") for r in last] == ["crash", "crash"], last
    assert not any(e["event"] == "done" for e in found)


def test_a_rank_that_gives_up_in_a_collective_says_timeout_and_restarts(tmp_path: Path) -> None:
    """$HPCTRAIN_COLLECTIVE_TIMEOUT_S=2: rank 0 hangs in step 3, rank 1 gives up waiting
    for it in the all-reduce after 2 s and says ``timeout`` (not ``crash``: it is not the
    failure; the supervisor names rank 0), then both restart in their processes."""
    state, ckpt, log = tmp_path / "s", tmp_path / "ckpt", tmp_path / "events.jsonl"
    state.mkdir()
    ckpt.mkdir()
    env = env_for(HPCTRAIN_STATE_DIR=str(state), HPCTRAIN_EXIT_FILE=str(state / p.EXIT),
                  HPCTRAIN_HEARTBEAT_S="0.2", HPCTRAIN_COLLECTIVE_TIMEOUT_S="2", **RUN)
    stand_in = StandIn(state, 2)
    procs = start_ranks(PROGRAMS / "allreduce_steps.py", 2, env, tmp_path / "out.txt", (
        "--inprocess", "--steps", "6", "--save-every", "2", "--step-sleep", "0.1",
        "--ckpt-dir", str(ckpt), "--events", str(log), "--hang", "0:3:0"))
    try:
        codes = wait_ranks(procs, timeout=90)
    finally:
        stand_in.done.set()
    out = (tmp_path / "out.txt").read_text()
    assert codes == [0, 0], out[-3000:]
    ((attempt, answered_at, words),) = stand_in.answered
    assert (attempt, words) == (1, ["interrupted", "timeout"]), out[-3000:]
    assert "Timed out waiting 2000ms" in out
    found = events(log)
    last_step = max(e["time"] for e in found if e["event"] == "step" and e["attempt"] == 0)
    assert 1.5 < answered_at - last_step < 6.0, answered_at - last_step
    assert [e["step"] for e in found if e["event"] == "step" and e["attempt"] == 1] == \
        [2, 3, 4, 5]


def test_the_interrupt_does_not_break_a_rank_already_leaving_on_its_own() -> None:
    """Seen on the devcluster (PP x DP, a hang): a rank's pipeline receive failed as a peer
    left ("Connection closed by peer") and the supervisor's SIGURG landed while it was in
    run's except clause, before restart() said it was leaving: the Interrupted raised there
    escaped run() and ended the process. The handler ignores a signal landing in run's or
    restart's own frame; a later one (sent each second) still reaches main's code."""
    from types import SimpleNamespace

    from hpctrain.runtime.restart import Interrupted, _Attempts, run

    attempts = object.__new__(_Attempts)      # only the handler's state matters here
    attempts._asked, attempts._leaving = True, False
    for code in (run.__code__, _Attempts.restart.__code__):
        attempts._on_signal(23, SimpleNamespace(f_code=code))   # ignored: leaving already
    in_main = SimpleNamespace(f_code=(lambda: None).__code__)   # somewhere in main's code
    with pytest.raises(Interrupted):
        attempts._on_signal(23, in_main)
    with pytest.raises(Interrupted):                            # and again, if caught
        attempts._on_signal(23, in_main)
    attempts._leaving = True
    attempts._on_signal(23, None)               # left: nothing to interrupt


def test_a_device_error_ends_the_attempt_and_the_processes(tmp_path: Path) -> None:
    """Rank 1 raises torch.AcceleratorError (CUDA's sticky error, a recorded message: no
    GPU here): its progress record stops offering an attempt in its process, the stand-in
    says stop, and both ranks leave with the exception for a restart in new processes."""
    state, ckpt, log = tmp_path / "s", tmp_path / "ckpt", tmp_path / "events.jsonl"
    state.mkdir()
    ckpt.mkdir()
    env = env_for(HPCTRAIN_STATE_DIR=str(state), HPCTRAIN_EXIT_FILE=str(state / p.EXIT),
                  HPCTRAIN_HEARTBEAT_S="0.2", **RUN)
    stand_in = StandIn(state, 2)
    procs = start_ranks(PROGRAMS / "allreduce_steps.py", 2, env, tmp_path / "out.txt", (
        "--inprocess", "--steps", "6", "--save-every", "2", "--step-sleep", "0.1",
        "--ckpt-dir", str(ckpt), "--events", str(log), "--device-error", "1:3:0"))
    try:
        codes = wait_ranks(procs, timeout=90)
    finally:
        stand_in.done.set()
    out = (tmp_path / "out.txt").read_text()
    assert codes == [1, 1], out[-3000:]
    ((_, _, words),) = stand_in.answered
    # Rank 0 either sees its peer's socket close first or the stand-in's interrupt first
    # (CI saw both): either word is true, neither is a crash of its own.
    assert words[0] == "crash" and words[1] in FREED, (words, out[-3000:])
    assert "rank 1: a device error: this process cannot start another attempt" in out
    assert "inprocess" not in records(state, 2)[1] and records(state, 2)[0]["inprocess"] == "1"
    assert p.read_record(state / p.EXIT)["error"].startswith(
        "AcceleratorError: CUDA error: an illegal memory access was encountered")


def test_nccl_ends_a_failed_attempt_not_the_process() -> None:
    """torch's default (TORCH_NCCL_ASYNC_ERROR_HANDLING=3) ends the process on a
    collective's timeout; run() asks for 2 (abort the communicators, raise) unless the job
    chose; gloo needs nothing."""
    from hpctrain.runtime.restart import nccl_settings

    assert nccl_settings("nccl", {}) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
    assert nccl_settings("cpu:gloo,cuda:nccl", {}) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
    assert nccl_settings("nccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}) == {}
    assert nccl_settings("gloo", {}) == {}
