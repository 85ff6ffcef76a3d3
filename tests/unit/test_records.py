"""The cross-process records, typed (hpctrain.protocol.records): what each writer writes is
what its one parser reads back, field for field, byte for byte (other hpctrain versions
read these files), and a file that is not such a record parses to None."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain import protocol
from hpctrain.protocol.records import ExitRecord, Identity, Sign, StopNotice, Verdict, of_run
from hpctrain.runtime.crashrecord import crash_fields

CRASH = {k: str(v) for k, v in crash_fields(
    RuntimeError, RuntimeError("boom"), step=None, restart_count=1, job_id="42", rank=3,
    node="n2", run_id="r1", at_step=20).items()}
# as Context.exit_for_requeue writes it
REQUEUE = ExitRecord(cause="preemption", exit_code=75, requeue=True, step=120, restart_count=0,
                     job_id="42_3", run_id="r1", node="n1").fields()


@pytest.mark.parametrize("kind, fields", [
    (ExitRecord, CRASH), (ExitRecord, REQUEUE),
    (StopNotice, {"run_id": "r1", "cause": "time_limit", "restart_count": "2",
                  "signal": "USR2"}),
    (Sign, {"node": "n2", "host": "10.0.0.2", "port": "40123", "pid": "77", "beat_s": "2",
            "error": ""}),
    (Identity, {"run_id": "r1", "job": "42", "cluster": "hpcdev", "submission": "s1",
                "created": "1795900000"}),
], ids=["crash", "requeue", "stop", "sign", "identity"])
def test_a_record_read_and_written_again_is_the_same_file(tmp_path: Path, kind: type,
                                                          fields: dict[str, str]) -> None:
    first, again = tmp_path / "first", tmp_path / "again"
    protocol.write_record(first, fields)
    record = kind.parse(protocol.read_record(first))
    assert record is not None
    protocol.write_record(again, record.fields())
    assert again.read_bytes() == first.read_bytes()


def test_what_is_not_a_record_is_none_and_one_rule_says_whose_it_is() -> None:
    assert ExitRecord.parse({}) is None and Identity.parse({"job": "42"}) is None
    assert StopNotice.parse({"signal": "USR2"}) is None and Verdict.parse({}) is None
    record = ExitRecord.parse(REQUEUE)
    assert record is not None and record.restart_count == 0       # a count, not text
    assert of_run(record, "r1", 0) and of_run(record, "r1")
    assert not of_run(record, "r2", 0) and not of_run(record, "r1", 1)
    assert not of_run(None, "r1")
