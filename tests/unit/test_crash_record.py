"""User crash -> exit record with cause=user_crash (never over a requeue record), and
`hpctrain status` reading the supervisor's verdict back from the job's state directory
(in the checkpoint dir or the submit dir; the command on the cluster:
tests/cluster/test_status_cluster.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import protocol
from hpctrain.commands.jobview import format_cause
from hpctrain.protocol import read_record, write_record
from hpctrain.protocol.records import ExitRecord, Verdict
from hpctrain.runtime.crashrecord import (crash_fields, device_lost, lost_peer, timed_out,
                                          write_crash_record)
from hpctrain.runtime.exitrecord import inferred_last_cause


def test_crash_fields_are_one_line_each_and_short() -> None:
    exc = ValueError("bad\nshape " + "x" * 1000)
    fields = crash_fields(ValueError, exc, step=7, restart_count=2, job_id="42", rank=3,
                          node="n2", run_id="r1")
    assert fields["cause"] == "user_crash" and fields["requeue"] == 0
    assert fields["step"] == 7 and fields["rank"] == 3 and fields["restart_count"] == 2
    assert fields["node"] == "n2" and fields["run_id"] == "r1"
    error = str(fields["error"])
    assert error.startswith("ValueError: bad shape xxx") and "\n" not in error
    assert len(error) <= 300 and error.endswith("...")


def test_storage_trouble_is_recorded_as_a_requeue_not_a_crash() -> None:
    """A root still locked by a dead node's job is not the code's fault: cause=storage,
    requeue=1, and the supervisor requeues (within max_storage_retries)."""
    from hpctrain.errors import StorageUnavailable

    exc = StorageUnavailable("checkpoint root /x is locked by another job (host=n2 pid=1)")
    fields = crash_fields(StorageUnavailable, exc, step=3, restart_count=0, job_id="42", rank=1)
    assert fields["cause"] == "storage" and fields["requeue"] == 1
    assert fields["error"].startswith("StorageUnavailable: checkpoint root /x is locked")


def test_a_rank_that_gave_up_waiting_in_a_collective_says_so() -> None:
    """Recorded messages: gloo's receive and send timeouts (torch 2.13, checked by
    tests/unit/test_runtime_restart.py on real processes) and NCCL's watchdog's."""
    def fields(exc: BaseException) -> dict[str, object]:
        return crash_fields(type(exc), exc, step=3, restart_count=0, job_id="1", rank=0)
    for text in ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                 "waiting 2000ms for recv operation to complete",
                 "[../unbound_buffer.cc:129] Timed out waiting 10000ms for send operation to "
                 "complete",
                 "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, "
                 "OpType=ALLREDUCE, Timeout(ms)=600000)"):
        assert fields(RuntimeError(text))["waited"] == 1
    try:
        try:
            raise RuntimeError("Timed out waiting 2000ms for recv operation to complete")
        except RuntimeError as inner:
            raise ValueError("while reducing the loss") from inner
    except ValueError as outer:
        assert fields(outer)["waited"] == 1          # the cause chain counts
    assert "waited" not in fields(RuntimeError("simulated crash"))
    closed = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
                          "closed by peer [127.0.0.1]:19865. This is typically caused by a "
                          "remote worker crashing.")
    assert lost_peer(closed) and not timed_out(closed) and "waited" not in fields(closed)
    assert not lost_peer(RuntimeError("simulated crash"))
    assert "waited" not in fields(ValueError("Timed out waiting for the user"))


@pytest.mark.torch
def test_a_device_error_is_told_from_other_errors() -> None:
    """torch raises AcceleratorError for CUDA's errors (recorded message; no GPU here):
    sticky, so the rank's process cannot start another attempt."""
    import torch

    illegal = torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    assert device_lost(illegal)
    assert device_lost(RuntimeError("CUDA error: uncorrectable ECC error encountered"))
    try:
        try:
            raise illegal
        except RuntimeError as inner:
            raise ValueError("in the optimizer step") from inner
    except ValueError as outer:
        assert device_lost(outer)
    assert not device_lost(RuntimeError("simulated crash"))
    assert not device_lost(torch.cuda.OutOfMemoryError("CUDA out of memory."))  # not sticky


def test_first_crash_wins_and_a_requeue_record_of_the_same_run_survives(
        tmp_path: Path) -> None:
    path = tmp_path / "exit"
    requeue = {"cause": "preemption", "exit_code": 75, "requeue": 1, "step": 40,
               "restart_count": 0, "job_id": "42"}
    write_record(path, requeue)
    assert not write_crash_record(str(path), RuntimeError, RuntimeError("late"), step=41,
                                  restart_count=0, job_id="42", rank=0)
    assert read_record(path)["cause"] == "preemption"
    # the requeued run (restart 1) crashes: its record replaces the previous run's
    assert write_crash_record(str(path), RuntimeError, RuntimeError("boom"), step=45,
                              restart_count=1, job_id="42", rank=1)
    assert not write_crash_record(str(path), OSError, OSError("peer gone"), step=45,
                                  restart_count=1, job_id="42", rank=0)
    rec = read_record(path)
    assert (rec["cause"], rec["rank"], rec["error"]) == ("user_crash", "1", "RuntimeError: boom")


def test_crash_record_never_raises_and_skips_ctrl_c(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    # the record's directory cannot be created (a file is in the way): no exception
    assert not write_crash_record(str(blocker / "sub" / "exit"), RuntimeError, RuntimeError(),
                                  step=None, restart_count=0, job_id="1", rank=0)
    assert not write_crash_record(str(tmp_path / "exit"), KeyboardInterrupt,
                                  KeyboardInterrupt(), step=1, restart_count=0, job_id="1",
                                  rank=0)
    assert not write_crash_record(None, RuntimeError, RuntimeError(), step=1,
                                  restart_count=0, job_id="1", rank=0)


HOOKED = """
import sys
from hpctrain.runtime.crashrecord import install_excepthook, write_crash_record
install_excepthook(lambda t, e: write_crash_record(sys.argv[1], t, e, step=3,
                   restart_count=0, job_id="9", rank=0))
raise ZeroDivisionError("division by zero at step 3")
"""


def test_excepthook_writes_the_record_and_keeps_the_traceback(tmp_path: Path) -> None:
    path = tmp_path / "exit"
    res = subprocess.run([sys.executable, "-c", HOOKED, str(path)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1
    assert "Traceback" in res.stderr and "ZeroDivisionError" in res.stderr
    rec = read_record(path)
    assert rec["cause"] == "user_crash" and rec["step"] == "3" and rec["requeue"] == "0"
    assert rec["error"] == "ZeroDivisionError: division by zero at step 3"


def test_format_cause() -> None:
    """The supervisor's verdict in the status table's CAUSE cell."""
    assert format_cause(None) == "-"
    assert format_cause(Verdict.parse({"cause": "completed", "action": "finish"})) == "-"
    crash = {"cause": "user_crash", "action": "finish", "step": "7", "rank": "1",
             "node": "n2", "error": "RuntimeError: x"}
    assert format_cause(Verdict.parse(crash)) == "user_crash@7 RuntimeError: x (rank 1, n2)"
    assert format_cause(Verdict.parse({"cause": "preemption", "action": "requeue", "step": "40"})) \
        == "last requeue: preemption@40"
    assert format_cause(Verdict.parse({"cause": "node_fail", "action": "leave"})) == "last requeue: node_fail"
    assert format_cause(Verdict.parse({"cause": "preemption", "action": "stop",
                         "limit": "max_preemptions=1"})) == "requeue limit max_preemptions=1 reached"
    assert format_cause(Verdict.parse({"cause": "cancelled", "action": "finish"})) == "cancelled"
    # every rank finished, then one died at exit: finished, and the death named (issue 31)
    assert format_cause(Verdict.parse({"cause": "completed", "action": "finish",
                         "detail": "rank 1 then died at exit (SIGABRT)"})) \
        == "finished; rank 1 then died at exit (SIGABRT)"


def test_a_state_record_is_read_from_the_checkpoint_dir_first(tmp_path: Path) -> None:
    ckpt, submit = tmp_path / "ckpt", tmp_path / "submit"
    write_record(protocol.state_dir(submit, "5") / protocol.OUTCOME, {"cause": "time_limit"})
    assert protocol.find_record("5", protocol.OUTCOME, str(ckpt), str(submit)) == \
        {"cause": "time_limit"}
    write_record(protocol.state_dir(ckpt, "5") / protocol.OUTCOME, {"cause": "user_crash"})
    assert protocol.find_record("5", protocol.OUTCOME, str(ckpt), str(submit))["cause"] == \
        "user_crash"
    assert protocol.find_record("6", protocol.OUTCOME, str(ckpt), str(submit)) == {}
    # an array task is its own job: 7_1's state is not 7's
    write_record(protocol.state_dir(ckpt, "7_1") / protocol.OUTCOME, {"cause": "cancelled"})
    assert protocol.find_record("7", protocol.OUTCOME, str(ckpt)) == {}


def test_a_crash_record_followed_by_a_requeue_means_node_failure() -> None:
    """Without a supervisor (the runtime under a plain launcher): the ranks that survive a
    node loss die of the lost peers and write a crash record (requeue=0); Slurm requeues
    the job anyway, so the next run reports node_fail."""
    crash = {"cause": "user_crash", "requeue": "0", "restart_count": "0", "step": "13"}
    assert inferred_last_cause(ExitRecord.parse(crash), 1) == "node_fail"
    assert inferred_last_cause(ExitRecord.parse({**crash, "cause": "preemption", "requeue": "1"}), 1) == "preemption"


def test_the_runtimes_count_of_the_step_is_recorded_apart_from_the_scripts_step() -> None:
    exc = RuntimeError("boom")
    counted = crash_fields(RuntimeError, exc, step=None, restart_count=0, job_id="1", rank=0,
                           at_step=20)
    assert (counted["step"], counted["at_step"]) == ("", 20)   # shown: no step; compared: 20
    said = crash_fields(RuntimeError, exc, step=5, restart_count=0, job_id="1", rank=0,
                        at_step=20)
    assert said["step"] == 5 and "at_step" not in said


def test_the_errors_digest_is_of_the_whole_error_not_the_cut_one() -> None:
    def digest(message: str) -> object:
        return crash_fields(RuntimeError, RuntimeError(message), step=3, restart_count=0,
                            job_id="1", rank=0)["error_digest"]
    head = "x" * 320
    assert digest(head + " (1)") != digest(head + " (2)")   # the same first 300 characters
    assert digest("boom") == digest("boom")
