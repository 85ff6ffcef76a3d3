"""``hpctrain report`` on the real devcluster: a 2x2 torchrun job that hangs once (rank 3
stops joining the all-reduce; restarted in place) and is preempted once (requeued). The
report's runs, causes, lost steps and goodput must match what this test counts itself
from the training script's own event log and sacct."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from hpctrain.slurm import client
from jobs_util import isolate
from slurm_util import wait_done, wait_until
from test_supervisor_cluster import events, job_log, preempt, submit
from test_watchdog_cluster import allreduce_command, spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPS = 30


def own_count(root: Path, job: str) -> tuple[int, float]:
    """(lost steps, goodput) from the script's events and sacct, without the report."""
    steps = [e for e in events(root, "step")]
    lost = len(steps) - len({e["step"] for e in steps})
    gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:]) if b["step"] == a["step"] + 1]
    out = client.run(["sacct", "-n", "-X", "-D", "-P", "-j", job, "-o", "ElapsedRaw"]).stdout
    allocated = sum(int(x) for x in out.split()) * 4
    return lost, STEPS * statistics.median(gaps) * 4 / allocated


class Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


@pytest.mark.torch
def test_the_report_of_a_job_that_hung_once_and_was_preempted_once(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    command = allreduce_command(root, "--hang", "3:8:0")
    command[command.index("--steps") + 1] = str(STEPS)
    job = submit(root, spec(root, command, launcher="torchrun", nodes=2,
                            watchdog="hang_timeout_s = 10"))
    wait_until(lambda: any(e.get("attempt") == 1 and e["step"] >= 16
                           for e in events(root, "step")), 180, "the in-place restart's steps")
    preempt(job)
    assert wait_done(job, 240) == "COMPLETED", job_log(root, job)

    html = root / "report.html"
    res = subprocess.run([sys.executable, "-m", "hpctrain", "report", job, "--json",
                          "--html", str(html)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    runs = rep["runs"]
    assert len(runs) == 2, rep
    assert [a["cause"] for a in runs[0]["attempts"]] == ["hang", "preemption"], rep
    assert runs[1]["cause"] == "completed" and len(runs[1]["attempts"]) == 1
    lost, goodput = own_count(root, job)
    assert abs(rep["lost_steps"] - lost) <= 1, (rep["lost_steps"], lost)
    assert abs(rep["goodput"] - goodput) <= 0.02, (rep["goodput"], goodput)
    assert rep["kept_steps"] == STEPS
    # the page says the same
    text = Text()
    text.feed(html.read_text())
    page = " ".join(text.parts)
    assert f"{rep['goodput']:.1%}" in page and "hang" in page and "preemption" in page
    # and the plain text report names every run
    plain = subprocess.run([sys.executable, "-m", "hpctrain", "report", job],
                           capture_output=True, text=True, timeout=60).stdout
    assert "run 0:" in plain and "run 1:" in plain and "goodput:" in plain, plain
    # the partition's report (sysadmins) counts it: its preemption, its emergency save
    part = subprocess.run([sys.executable, "-m", "hpctrain", "report", "--partition", "debug",
                           "--since", "2h", "--json"], capture_output=True, text=True,
                          timeout=60)
    assert part.returncode == 0, part.stderr
    fleet = json.loads(part.stdout)
    assert fleet["requeues"].get("preemption", 0) >= 1 and fleet["grace_s"] == 10, fleet
    assert fleet["emergency_saves_s"] and fleet["median_emergency_save_s"] < 10, fleet
    # status --watch stops by itself once the job has ended
    watched = subprocess.run([sys.executable, "-m", "hpctrain", "status", job, "--watch", "1"],
                             capture_output=True, text=True, timeout=60)
    assert watched.returncode == 0 and "COMPLETED" in watched.stdout, watched
