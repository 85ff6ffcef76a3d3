"""The one job view without a cluster: the handle's contract (local and remote), the wait
loop, the results, and ``status`` / ``_serve`` over a Slurm that answers from a script."""

from __future__ import annotations

import base64
import json
import pickle
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from helpers.jobs import isolate
from hpctrain import cli
from hpctrain.errors import JobError
from hpctrain.jobs import index, results
from hpctrain.jobs.contract import JobHandle, wait_for
from hpctrain.jobs.handle import Job
from hpctrain.jobs.index import JobEntry
from hpctrain.jobs.listing import collect, status_json
from hpctrain.jobs.poll import JobInfo
from hpctrain.remote.client import Cluster, RemoteJob
from hpctrain.slurm import client
from hpctrain.slurm.states import from_slurm

HEADER = "JobID|JobIDRaw|State|Elapsed|Start|End|NodeList|AllocNodes|ExitCode|Reason|JobName"


def info(state: str) -> JobInfo:
    return JobInfo("7", from_slurm(state))


# ---- the contract ----------------------------------------------------------------------------
def test_local_and_remote_jobs_keep_one_contract() -> None:
    assert issubclass(Job, JobHandle) and issubclass(RemoteJob, JobHandle)
    assert JobHandle.__abstractmethods__ == {"name", "info", "done", "updates", "logs",
                                             "follow", "cancel", "result"}


def test_the_wait_loop_ends_when_the_job_is_over_and_closes_the_stream() -> None:
    closed, seen = [], []

    def updates() -> Iterator[tuple[JobInfo, bool]]:
        try:
            yield info("PENDING"), False
            yield info("PREEMPTED"), False      # requeued: not over
            yield info("COMPLETED"), True
            yield info("UNKNOWN"), True         # never asked for
        finally:
            closed.append(True)

    last = wait_for("7", updates(), on_update=lambda i: seen.append(str(i.state)))
    assert str(last.state) == "COMPLETED" and seen == ["PENDING", "PREEMPTED", "COMPLETED"]
    assert closed == [True]


def test_a_wait_that_times_out_or_loses_its_stream_says_so() -> None:
    endless = iter([(info("RUNNING"), False)] * 3)
    with pytest.raises(JobError, match=r"job 7 still RUNNING after -1s \(it keeps running; "
                                       r"wait again or `hpctrain cancel` it\)"):
        wait_for("7", endless, timeout_s=-1, cancel_hint="`hpctrain cancel` it")
    with pytest.raises(JobError, match="^lost the wait on job 7$"):
        wait_for("7", iter([(info("RUNNING"), False)]))
    with pytest.raises(JobError, match="still RUNNING after 5s .*or cancel it"):
        wait_for("7", iter([(info("RUNNING"), False)]), timeout_s=5)   # a stream cut at 5 s


# ---- results -----------------------------------------------------------------------------------
def test_results_are_values_by_rank_or_the_error_of_the_rank(tmp_path: Path) -> None:
    blob = [pickle.dumps(("success", {"rank": r})) for r in range(2)]
    assert results.decode_results("9", "COMPLETED", blob, "x") == [{"rank": 0}, {"rank": 1}]
    assert results.decode_results("9", "COMPLETED", blob[:1], "x") == {"rank": 0}
    with pytest.raises(JobError, match="job 9, rank 1 raised:\nValueError: bad"):
        results.decode_results("9", "FAILED", [blob[0], pickle.dumps(("error", "ValueError: bad"))],
                               "x")
    # rank 1 raised and srun ended rank 0 before it wrote a result (CI, under load): the
    # error comes back, not the missing result
    with pytest.raises(JobError, match=r"job 9, rank 1 raised \(rank\(s\) 0 left no result: "
                                       r"the step was ended\):\nValueError: bad"):
        results.decode_results("9", "FAILED", [None, pickle.dumps(("error", "ValueError: bad"))],
                               "x")
    with pytest.raises(JobError, match="job 9 ended CANCELLED without a result for rank 0: "
                                       "`hpctrain logs 9` shows why"):
        results.decode_results("9", "CANCELLED", [None], "`hpctrain logs 9`")
    results.result_path(tmp_path, "9", 1).write_bytes(blob[1])
    assert results.read_result_files(tmp_path, "9", 2) == [None, blob[1]]
    assert results.read_result_files(tmp_path, "9", 0) == [None]   # a job has one task at least


# ---- over a scripted Slurm ---------------------------------------------------------------------
class Slurm:
    """``client.run`` answering sacct from ``states`` (one per poll, the last repeated)
    and squeue with the ids in ``queued``; it records every call."""

    def __init__(self, states: dict[str, list[str]], queued: tuple[str, ...] = ()) -> None:
        self.states = states
        self.queued = queued
        self.calls: list[str] = []

    def run(self, argv: list[str], **_: object) -> client.Result:
        self.calls.append(argv[0])
        ids = argv[argv.index("-j") + 1].split(",")
        if argv[0] == "squeue":
            out = "".join(f"{i}|{i}|PENDING|0:00|1|(null)|Priority|x\n"
                          for i in ids if i in self.queued)
            return client.Result(tuple(argv), 0, out, "")
        rows = []
        for jid in ids:
            seq = self.states.get(jid, [])
            state = seq.pop(0) if len(seq) > 1 else (seq[0] if seq else "")
            if state:
                rows.append(f"{jid}|{jid}|{state}|00:01:00|x|y|n1|1|0:0|None|job{jid}")
        return client.Result(tuple(argv), 0, "\n".join([HEADER, *rows]) + "\n", "")


@pytest.fixture()
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Slurm:
    root = isolate(monkeypatch, tmp_path)
    fake = Slurm({})
    monkeypatch.setattr(client, "run", fake.run)
    folder = root / "jobs" / "fn"
    folder.mkdir(parents=True)
    index.append([
        JobEntry(job_id="11", name="train", kind="script", folder=str(root / "jobs" / "t")),
        JobEntry(job_id="12", name="fn", kind="function", folder=str(folder), num_tasks=2),
        JobEntry(job_id="20", name="sw", kind="sweep", folder="", num_tasks=2, sweep_id="s-9",
                 points=[{"lr": "1"}, {"lr": "2"}])])
    for task, value in enumerate(["a", "b"]):
        results.result_path(folder, "12", task).write_bytes(pickle.dumps(("success", value)))
    return fake


def test_a_wait_outlasts_a_requeue_and_asks_squeue_only_then(slurm: Slurm) -> None:
    slurm.states["11"] = ["RUNNING", "PREEMPTED", "COMPLETED"]
    slurm.queued = ("11",)
    seen: list[str] = []
    last = Job.attach("11").wait(poll_s=0, on_update=lambda i: seen.append(str(i.state)))
    assert str(last.state) == "COMPLETED" and seen == ["RUNNING", "PREEMPTED", "COMPLETED"]
    assert slurm.calls == ["sacct", "sacct", "squeue", "sacct"]


def test_a_local_result_reads_the_ranks_files(slurm: Slurm) -> None:
    slurm.states["12"] = ["COMPLETED"]
    assert Job.attach("12").result() == ["a", "b"]
    with pytest.raises(JobError, match="runs a script"):
        Job.attach("11").result()


def test_a_sweep_tasks_state_directory_is_its_points(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """report 40_1 and Job.attach("40_1") look where the point's supervisor wrote: the
    point's checkpoint dir, not the array's (status always did)."""
    from hpctrain import protocol
    from hpctrain.jobs import statedir

    root = isolate(monkeypatch, tmp_path)
    index.append([JobEntry(job_id="40", name="sw", kind="sweep", folder=str(root),
                           num_tasks=2, sweep_id="40", checkpoint_dir=str(root / "ck"),
                           points=[{"lr": "1"}, {"lr": "2"}])])
    point = Path(statedir.task_entry(index.find("40"), 1).checkpoint_dir)
    assert point != root / "ck"
    protocol.state_dir(point, "40_1").mkdir(parents=True)
    assert statedir.lookup("40_1") == protocol.state_dir(point, "40_1")
    assert Job.attach("40_1").entry.checkpoint_dir == str(point)
    assert Job.attach("40").entry.checkpoint_dir == str(root / "ck")


def test_status_json_is_the_listing_and_the_cli_prints_it(
        slurm: Slurm, capsys: pytest.CaptureFixture[str]) -> None:
    slurm.states.update({"11": ["RUNNING"], "12": ["COMPLETED"], "20": ["PENDING"]})
    listing = collect()
    assert [j["job_id"] for j in listing.to_json()["jobs"]] == ["11", "12", "s-9"]
    assert listing.to_json()["jobs"][2] == {"job_id": "s-9", "name": "sw", "kind": "sweep",
                                            "arrays": ["20"], "points": 2,
                                            "state_counts": {"UNKNOWN": 2}}
    assert not listing.ended()
    assert cli.main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == status_json() == {
        **listing.to_json(), "slurm_calls": 1}
    assert Cluster().status() == status_json()["jobs"]
    tasks = status_json(("s-9",))["jobs"]     # a sweep asked for by id: its tasks
    assert [(t["job_id"], t["point"]) for t in tasks] == [("20_0", {"lr": "1"}),
                                                          ("20_1", {"lr": "2"})]


def test_the_cluster_side_streams_changes_until_the_job_is_over(
        slurm: Slurm, capsys: pytest.CaptureFixture[str]) -> None:
    slurm.states["11"] = ["PENDING", "PENDING", "RUNNING", "COMPLETED"]
    assert cli.main(["_serve", "wait", "11", "--poll", "0"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(x["state"], x["over"]) for x in lines] == [("PENDING", False), ("RUNNING", False),
                                                        ("COMPLETED", True)]
    assert cli.main(["_serve", "info", "11"]) == 0
    assert json.loads(capsys.readouterr().out)["over"] is True


class Here:
    """A Cluster whose 'remote' hpctrain is this process's CLI (over a scripted Slurm)."""

    target = "alice@login1"

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.conn = self
        self.words: list[list[str]] = []

    def _run(self, args: list[str]) -> subprocess.CompletedProcess[bytes]:
        self.capsys.readouterr()
        code = cli.main(list(args))
        out = self.capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out.encode(), out.err.encode())

    def hpctrain_words(self, args: list[str]) -> list[str]:
        return ["hpctrain", *args]

    def hpctrain(self, args: list[str], input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return self._run(args)

    def _call(self, args: list[str], what: str) -> dict:
        return json.loads(self._run(args).stdout.decode().splitlines()[-1])

    def lines(self, words: list[str], timeout_s: float | None = None) -> Iterator[str]:
        self.words.append(words)
        yield from self._run(words[1:]).stdout.decode().splitlines()


def test_a_remote_job_answers_as_the_local_one(
        slurm: Slurm, capsys: pytest.CaptureFixture[str]) -> None:
    slurm.states.update({"11": ["COMPLETED"], "12": ["COMPLETED"]})
    here = Here(capsys)
    remote, local = RemoteJob(here, "12"), Job.attach("12")   # type: ignore[arg-type]
    assert remote.info().state == local.info().state and remote.done() and local.done()
    assert remote.result() == local.result() == ["a", "b"]
    assert here.words[-1] == ["hpctrain", "_serve", "wait", "12"]
    RemoteJob(here, "11").wait(poll_s=0.5)   # type: ignore[arg-type]
    assert here.words[-1] == ["hpctrain", "_serve", "wait", "11", "--poll", "0.5"]
    data = json.loads(here._run(["_serve", "result", "12"]).stdout)
    assert [pickle.loads(base64.b64decode(b)) for b in data["results"]] == [
        ("success", "a"), ("success", "b")]


def test_a_wait_asks_less_often_while_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 s after a change, then half again each unchanged poll up to 10 s: 40 users waiting
    on one login node ask the controller 4 times a second, not 20."""
    states = ["PENDING"] * 3 + ["RUNNING"] * 6 + ["COMPLETED"]
    infos = iter(JobInfo(job_id="7", state=from_slurm(s), slurm_state=s) for s in states)
    job = Job(JobEntry("7", "w", "script", "/f"))
    monkeypatch.setattr(job, "info", lambda: next(infos))
    monkeypatch.setattr(job, "over", lambda info: info.slurm_state == "COMPLETED")
    pauses: list[float] = []
    seen = [info.slurm_state for info, _ in job.updates(poll_s=2.0, idle=pauses.append)]
    assert seen == states
    assert pauses == [2.0, 3.0, 4.5, 2.0, 3.0, 4.5, 6.75, 10.0, 10.0]
