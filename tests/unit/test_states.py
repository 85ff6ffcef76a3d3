"""The one Slurm -> hpctrain state table, and the Slurm output parsers status relies on."""

from __future__ import annotations

import pytest

from hpctrain.slurm import states
from hpctrain.slurm.parse import (parse_elapsed, parse_sacct_parsable2, parse_sbatch_directives,
                                  parse_sbatch_parsable, parse_scontrol_config, parse_squeue,
                                  run_ends, sbatch_header)
from hpctrain.slurm.states import Outcome, from_slurm
from hpctrain.jobs.poll import infos_from_sacct, infos_from_squeue, last_checkpoint_step


@pytest.mark.parametrize("raw", ["PREEMPTED", "REQUEUED", "TIMEOUT", "NODE_FAIL"])
def test_interruptions_stay_distinct_and_are_never_failures(raw: str) -> None:
    state = from_slurm(raw)
    assert state.name == raw
    assert state.outcome is Outcome.INTERRUPTED
    assert not state.failed
    assert state.may_resume


def test_every_interruption_has_its_own_cause() -> None:
    causes = {from_slurm(s).cause for s in ("PREEMPTED", "REQUEUED", "TIMEOUT", "NODE_FAIL")}
    assert causes == {"preemption", "requeued", "time_limit", "node_fail"}


@pytest.mark.parametrize("raw,name,outcome", [
    ("COMPLETED", "COMPLETED", Outcome.SUCCESS),
    ("FAILED", "FAILED", Outcome.FAILURE),
    ("OUT_OF_MEMORY", "OUT_OF_MEMORY", Outcome.FAILURE),
    ("CANCELLED by 0", "CANCELLED", Outcome.CANCELLED),
    ("PENDING", "PENDING", Outcome.ACTIVE),
    ("running", "RUNNING", Outcome.ACTIVE),
    ("PD", "PENDING", Outcome.ACTIVE),      # squeue short codes
    ("PR", "PREEMPTED", Outcome.INTERRUPTED),
    ("NF", "NODE_FAIL", Outcome.INTERRUPTED),
    ("CA", "CANCELLED", Outcome.CANCELLED),
])
def test_mapping(raw: str, name: str, outcome: Outcome) -> None:
    assert (from_slurm(raw).name, from_slurm(raw).outcome) == (name, outcome)


def test_unknown_state_is_unknown_not_failure() -> None:
    for raw in ("", "WEIRD_NEW_STATE"):
        assert from_slurm(raw) is states.UNKNOWN
        assert not from_slurm(raw).failed and not from_slurm(raw).final


def test_table_covers_every_squeue_code_and_every_name_is_ordered() -> None:
    assert set(states.SHORT_CODES.values()) <= set(states.TABLE)
    assert {s.name for s in states.TABLE.values()} <= set(states.ORDER)


SACCT = """JobID|JobIDRaw|State|Elapsed|Start|End|NodeList|AllocNodes|ExitCode|Reason|JobName
6|6|PREEMPTED|00:00:07|2026-11-21T04:50:00|2026-11-21T04:50:07|n[1-2]|2|0:0|None|p|x
6|6|REQUEUED|00:00:03|2026-11-21T04:50:20|2026-11-21T04:50:23|n1|1|0:0|None|p|x
6|6|RUNNING|00:01:02|2026-11-21T04:50:40|Unknown|n[1-2]|2|0:0|None|p|x
7|7|PREEMPTED|00:00:07|2026-11-21T04:50:00|2026-11-21T04:50:07|n1|1|0:0|None|q
7|7|PENDING|00:00:00|Unknown|Unknown|None assigned|0|0:0|BeginTime|allocation
9|9|FAILED|00:00:01|2026-11-21T04:51:00|2026-11-21T04:51:01|n1|1|1:0|None|boom
20_[3-5%2]|20|PENDING|00:00:00|Unknown|Unknown|None assigned|0|0:0|JobArrayTaskLimit|sw
20_0|21|COMPLETED|00:00:01|2026-11-21T04:52:00|2026-11-21T04:52:01|n1|1|0:0|None|sw
733|733|RESIZING|00:00:14|2026-11-26T03:39:05|2026-11-26T03:39:19|n[1-3]|3|0:0|None|el
733|733|RESIZING|00:00:17|2026-11-26T03:39:19|2026-11-26T03:39:36|n[1,3]|2|0:0|None|el
733|733|COMPLETED|00:00:09|2026-11-26T03:40:50|2026-11-26T03:40:59|n[1-3]|3|0:0|None|el
"""


def test_sacct_records_fold_into_one_info_per_job_with_requeues_by_cause() -> None:
    infos = infos_from_sacct(parse_sacct_parsable2(SACCT))
    six = infos["6"]
    assert six.state.name == "RUNNING"
    assert six.requeues == {"preemption": 1, "requeued": 1}
    assert six.elapsed_s == 62 and six.nodes == "n[1-2]" and six.num_nodes == 2
    assert six.name == "p|x"  # the last field keeps a separator in a job name
    assert infos["9"].state.failed and infos["9"].exit_code == "1:0"
    # pending again after a preemption: shown as REQUEUED (Slurm says PENDING)
    assert infos["7"].state.name == "REQUEUED" and infos["7"].slurm_state == "PENDING"
    assert infos["7"].requeues == {"preemption": 1}
    # slurmdbd's placeholder on the requeued run's row: the job is still "q"
    assert infos["7"].name == "q"
    # a pending array's range line becomes one PENDING info per task
    assert [infos[f"20_{i}"].state.name for i in (3, 4, 5)] == ["PENDING"] * 3
    assert infos["20_0"].raw_id == "21" and infos["20_0"].state.name == "COMPLETED"
    # [elastic] spare nodes, as the devcluster recorded it: n2 taken from the running job
    # (a RESIZING row, the next starting as it ended: the run went on), then n3, and the
    # job requeued (its RESIZING row is the run's last: sacct wrote no REQUEUED row)
    assert infos["733"].requeues == {"requeued": 1}


def test_how_each_run_ended_skips_the_rows_a_resize_closed() -> None:
    """``sacct -X -D -P -o State,Start,End`` as the supervisor asks it (the rows of a job
    with a spare node, as the devcluster wrote them): a node given back to Slurm closes a
    RESIZING row and the run goes on in the next one. CI once read the resize as run 0's
    end and named a NODE_FAIL requeue a bare "requeued"."""
    def rows(*spans: tuple[str, str, str]) -> str:
        return "State|Start|End\n" + "".join(
            f"{state}|2026-11-29T{start}|2026-11-29T{end}\n" for state, start, end in spans)

    # n2 given to the spare, then n3 lost all at once: Slurm ended the run NODE_FAIL
    lost = rows(("RESIZING", "03:39:05", "03:39:19"), ("NODE_FAIL", "03:39:19", "03:39:50"),
                ("RUNNING", "03:41:02", "Unknown"))
    assert run_ends(parse_sacct_parsable2(lost)) == ["NODE_FAIL", "RUNNING"]
    # n2, then n3 given back and the job requeued: sacct closed the RESIZING row, no more
    given = rows(("RESIZING", "03:39:05", "03:39:19"), ("RESIZING", "03:39:19", "03:39:36"),
                 ("COMPLETED", "03:40:50", "03:40:59"))
    assert run_ends(parse_sacct_parsable2(given)) == ["RESIZING", "COMPLETED"]
    # still running after a resize; a plain job; nothing yet
    assert run_ends(parse_sacct_parsable2(rows(("RESIZING", "03:39:05", "03:39:19"),
                                               ("RUNNING", "03:39:19", "Unknown")))) == \
        ["RUNNING"]
    assert run_ends(parse_sacct_parsable2(rows(("PREEMPTED", "01:00:00", "01:00:09"),
                                               ("COMPLETED", "01:02:00", "01:03:00")))) == \
        ["PREEMPTED", "COMPLETED"]
    assert run_ends(parse_sacct_parsable2("")) == []


def test_squeue_format_is_parsed_into_the_same_infos() -> None:
    text = "31|31|RUNNING|1:05|2|n[1-2]|None|train\n40|40_7|PENDING|0:00|1||Priority|s|w\n"
    infos = infos_from_squeue(parse_squeue(text))
    assert infos["31"].elapsed_s == 65 and infos["31"].state.name == "RUNNING"
    assert infos["40_7"].raw_id == "40" and infos["40_7"].name == "s|w"


@pytest.mark.parametrize("text,seconds", [("00:00:07", 7), ("1:05", 65), ("2-01:00:00", 176400),
                                          ("INVALID", None), ("", None)])
def test_elapsed(text: str, seconds: int | None) -> None:
    assert parse_elapsed(text) == seconds


def test_sbatch_parsable_and_config_and_directives() -> None:
    assert parse_sbatch_parsable("123\n") == "123"
    assert parse_sbatch_parsable("124;hpcdev\n") == "124"
    with pytest.raises(ValueError):
        parse_sbatch_parsable("sbatch: error: nope")
    assert parse_scontrol_config("MaxArraySize            = 1001\nfoo\n")["MaxArraySize"] == "1001"
    script = "#!/bin/bash\n# c\n#SBATCH --output=/x/%j.out\n#SBATCH --requeue\nset -u\n#SBATCH --nodes=9\n"
    assert parse_sbatch_directives(script) == {"output": "/x/%j.out", "requeue": ""}
    assert sbatch_header(script)[-1] == "#SBATCH --requeue"


def test_last_checkpoint_step_reads_plain_files(tmp_path) -> None:
    assert last_checkpoint_step(str(tmp_path)) is None
    (tmp_path / "step_000000300").mkdir()
    (tmp_path / "step_000000300" / "manifest.json").write_text('{"step": 300, "files": []}')
    (tmp_path / "latest").write_text("step_000000300\n")
    assert last_checkpoint_step(str(tmp_path)) == 300
    (tmp_path / "latest").write_text('{"step": 42}')   # not the layout checkpoint/ writes
    assert last_checkpoint_step(str(tmp_path)) is None
    assert last_checkpoint_step("") is None


def test_last_checkpoint_step_reads_what_the_checkpoint_package_writes(tmp_path) -> None:
    from hpctrain.checkpoint.catalog import write_latest

    write_latest(tmp_path, 1200)
    assert last_checkpoint_step(str(tmp_path)) == 1200
