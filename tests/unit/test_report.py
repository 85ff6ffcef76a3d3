"""``hpctrain report``'s accounting (hpctrain.report.build, pure) and its HTML page, on a job
whose history is written out here: a hang restarted in place, then a preemption."""

from __future__ import annotations

import re
from dataclasses import replace
from html.parser import HTMLParser

import pytest

from hpctrain.protocol.ledger import entries
from hpctrain.report.build import CATEGORIES, RunFacts, build
from hpctrain.report.html import to_html

GPUS = 4
RUNS = [RunFacts(0, "REQUEUED", 90.0, 100.0, 145.0, 45.0, "n[1-2]", GPUS),
        RunFacts(1, "COMPLETED", 145.0, 160.0, 173.0, 13.0, "n[1-2]", GPUS)]
LEDGER = entries("restart cause=hang restart_count=0 attempt=1 at=127.0 detected_at=125.0\n"
                 "requeue cause=preemption restart_count=1 by=supervisor\n")


def ev(t: float, restart: int, attempt: int, **kw: object) -> dict:
    return {"t": t, "restart": restart, "attempt": attempt, **kw}


def history() -> list[dict]:
    out = [ev(101.0, 0, 0, event="phase", phase="startup"),
           ev(109.0, 0, 0, event="phase", phase="training")]
    out += [ev(110.0 + s, 0, 0, event="step", step=s, n=s + 1) for s in range(6)]
    out += [ev(113.2, 0, 0, event="phase", phase="saving"),
            ev(113.5, 0, 0, event="phase", phase="training")]     # saved step 3 after step 2
    # attempt 1 (in place, after the hang) resumes from step 3
    out += [ev(128.0, 0, 1, event="phase", phase="startup")]
    out += [ev(132.0 + s, 0, 1, event="step", step=s, n=s - 2) for s in range(3, 8)]
    # run 1 (after the preemption: emergency save of step 8) does 8 and 9
    out += [ev(170.0 + i, 1, 0, event="step", step=s, n=i + 1) for i, s in enumerate((8, 9))]
    return out


def test_runs_attempts_causes_and_lost_work() -> None:
    r = build("42", RUNS, LEDGER, history(), final_cause="completed")
    assert [(run.restart, run.cause, run.queue_s) for run in r.runs] == [
        (0, "preemption", 10.0), (1, "completed", 15.0)]
    first, second = r.runs[0].attempts
    assert (first.attempt, first.cause, first.begin, first.end) == (0, "hang", 100.0, 127.0)
    assert (second.attempt, second.cause, second.end) == (1, "preemption", 145.0)
    assert (first.steps, first.redone, second.steps, second.redone) == (6, 3, 5, 0)
    assert (r.kept_steps, r.lost_steps) == (10, 3)
    assert r.step_s == pytest.approx(1.0)


def test_every_allocated_gpu_second_is_in_one_category() -> None:
    r = build("42", RUNS, LEDGER, history(), final_cause="completed")
    assert r.allocated_gpu_s == (45 + 13) * GPUS
    assert sum(r.gpu_s.values()) == pytest.approx(r.allocated_gpu_s)
    # kept: 10 steps of ~1 s (step 3 of attempt 0 minus its 0.3 s save, lost anyway)
    assert r.gpu_s["kept"] == pytest.approx(10 * GPUS, abs=0.5)
    assert r.gpu_s["redone"] == pytest.approx(3 * GPUS - 0.3 * GPUS, abs=0.5)
    assert r.gpu_s["saving"] == pytest.approx(0.3 * GPUS)
    # the hang: the last step of attempt 0 (t=115) to its in-place restart (t=127)
    first = r.runs[0].attempts[0]
    assert first.seconds["stopping"] == pytest.approx(12.0)
    assert first.seconds["startup"] == pytest.approx(9.0)   # 100 -> 110, minus step 0
    assert r.goodput == pytest.approx(10 / 58, abs=0.01)


def test_each_restart_says_how_it_began_and_what_it_cost() -> None:
    """A crash restarted in the running processes (runtime.run) next to the hang restarted
    as a new step: each attempt says which, and the recovery from the last step before to
    the first step after; the summary line gives the median of each kind."""
    from hpctrain.commands.report import format_text

    ledger = entries("restart cause=user_crash restart_count=0 attempt=1 at=116.0 "
                     "mode=inprocess\n"
                     "restart cause=hang restart_count=0 attempt=2 at=127.0\n"
                     "requeue cause=preemption restart_count=1 by=supervisor\n")
    events = [e for e in history() if e["attempt"] == 0]
    events += [ev(117.5 + i, 0, 1, event="step", step=s, n=i + 1) for i, s in enumerate((4, 5))]
    events += [ev(132.0 + s, 0, 2, event="step", step=s, n=s - 2) for s in range(3, 8)]
    events += [ev(170.0 + i, 1, 0, event="step", step=s, n=i + 1) for i, s in enumerate((8, 9))]
    r = build("42", RUNS, ledger, events, final_cause="completed")
    first, crash, hang = r.runs[0].attempts
    assert [(a.mode, a.cause) for a in (first, crash, hang)] == [
        ("", "user_crash"), ("inprocess", "hang"), ("new", "preemption")]
    # the crash: last step at 115, the next one starts at 116.5 (completed at 117.5)
    assert crash.recovery_s == pytest.approx(1.5) and first.recovery_s is None
    # the hang: last step at 118.5, the next one starts at 134 (completed at 135)
    assert hang.recovery_s == pytest.approx(15.5)
    assert (r.recoveries("inprocess"), r.recoveries("new")) == ([1.5], [15.5])
    text = format_text(r).splitlines()
    assert any(line.startswith("    attempt 1 (in-process, back in 1.5 s): ") for line in text)
    assert any(line.startswith("    attempt 2 (in new processes, back in 15.5 s): ")
               for line in text)
    assert "  restarts in the allocation: 1 in-process (median 1.5 s from the last step " \
           "before to the first after); 1 in new processes (median 15.5 s from the last " \
           "step before to the first after)" in text
    assert "attempt 1 (in-process): start-up" in to_html(r)


def test_a_rank_that_died_at_exit_after_the_work_is_a_note_not_a_failure() -> None:
    from hpctrain.commands.report import format_text

    r = build("42", RUNS, LEDGER, history(), final_cause="completed",
              note="rank 1 then died at exit (SIGABRT)")
    assert r.runs[-1].cause == "completed" and r.to_json()["note"] == r.note
    assert "  the work was done, then: rank 1 then died at exit (SIGABRT)" in \
        format_text(r).splitlines()
    assert "the work was done" not in format_text(build("42", RUNS, LEDGER, history()))


def test_a_job_without_history_has_runs_and_causes_but_no_goodput() -> None:
    r = build("42", RUNS, LEDGER, [], final_cause="completed")
    assert r.goodput is None and not r.known and [run.cause for run in r.runs] == [
        "preemption", "completed"]
    assert set(r.gpu_s) == set(CATEGORIES)


class Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, str] = {}
        self.classes: list[str] = []
        self.text: list[str] = []
        self._stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if "id" in a:
            self.ids[a["id"]] = tag
        if a.get("class"):
            self.classes.append(a["class"])

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_the_html_page_carries_the_runs_causes_and_numbers_of_the_json() -> None:
    r = build("42", RUNS, LEDGER, history(), final_cause="completed")
    page = to_html(r)
    parsed = Collect()
    parsed.feed(page)
    assert {"goodput", "runs", "spent", "timeline", "steps"} <= set(parsed.ids)
    text = " ".join(parsed.text)
    assert f"{r.goodput:.1%}" in text and "10 steps kept, 3 lost" in text
    for cause in ("hang", "preemption", "completed"):
        assert cause in text
    # the timeline draws the table's categories, and the queue (a slow node: below)
    assert {"queue", *CATEGORIES} - {"slow"} <= set(parsed.classes)
    # lost work is visible: re-done steps drawn red, as dots and in the lanes
    assert len(re.findall('fill="#c0392b"/>', page)) == 3
    assert 'fill="#c0392b" class="redone"' in page
    assert "<script" not in page and "http://" not in page.replace(
        "http://www.w3.org/2000/svg", "")


def test_the_pages_colours_and_words_agree_and_it_says_what_goodput_and_attempts_are() -> None:
    """Issue 43: one colour and one word per category in the table, the timeline's legend
    and the steps plot; red means lost work only; the queue is visible; goodput, runs and
    attempts are explained on the page."""
    from hpctrain.report.html import COLORS, LABELS

    page = to_html(build("42", RUNS, LEDGER, history(), final_cause="completed"))
    parsed = Collect()
    parsed.feed(page)
    text = " ".join(parsed.text)
    assert len(set(COLORS.values())) == len(COLORS)          # one colour, one meaning
    assert [k for k, c in COLORS.items() if c == "#c0392b"] == ["redone"]
    for kind in ("queue", *CATEGORIES):
        label = LABELS[kind]
        # the table's row and the legend say the same word beside the same colour
        legend = f'<tspan fill="{COLORS[kind]}">&#9632;</tspan><tspan> {label}  </tspan>'
        assert legend in page, kind
        if kind != "queue":
            assert f'background:{COLORS[kind]}"></span> {label}</td>' in page, kind
        if kind != "slow":     # (drawn only where a node was slow: below)
            assert f'fill="{COLORS[kind]}" class="{kind}"' in page, kind   # drawn so
    for kind in ("kept", "redone"):                               # the steps plot's legend
        assert f'<tspan fill="{COLORS[kind]}">&#9679;</tspan><tspan> {LABELS[kind]}' in page
    # the queue's colour stands out from the white page (not a near-white grey)
    red, green, blue = (int(COLORS["queue"][i:i + 2], 16) for i in (1, 3, 5))
    assert 0.2126 * red + 0.7152 * green + 0.0722 * blue < 180
    assert "words" in parsed.ids
    for word in ("goodput", "run", "attempt"):
        assert f"{word} " in text
    assert "allocated GPU-time" in text and "inside a run" in text


# ---- a partition over a period (sysadmins) ---------------------------------------------------
def test_a_partitions_requeues_gpu_hours_goodput_and_emergency_saves() -> None:
    from hpctrain.commands.report_partition import since_arg
    from hpctrain.errors import ReportError
    from hpctrain.report.partition import RunRow, aggregate, emergency_saves

    rows = [RunRow("42", "ml", "REQUEUED", 45, 4), RunRow("42", "ml", "COMPLETED", 13, 4),
            RunRow("7", "vision", "PREEMPTED", 3600, 8), RunRow("7", "vision", "NODE_FAIL", 60, 8),
            RunRow("7", "vision", "COMPLETED", 600, 8)]
    saving = [ev(140.0, 0, 1, event="phase", phase="saving"),
              ev(142.5, 0, 1, event="phase", phase="training"),
              ev(142.6, 0, 1, event="phase", phase="exiting"),
              ev(150.0, 1, 0, event="phase", phase="saving"),        # a periodic save
              ev(150.2, 1, 0, event="phase", phase="training")]
    assert emergency_saves(saving) == [2.5]
    rep = build("42", RUNS, LEDGER, history() + saving, final_cause="completed")
    part = aggregate("debug", "7d", rows, {"42": LEDGER}, {"42": rep}, {"42": saving}, 10)
    # job 42's ledger knows its requeue was a preemption; job 7's come from sacct's states
    assert part.requeues == {"preemption": 2, "node_fail": 1}
    assert part.gpu_hours == {"ml": pytest.approx(58 * 4 / 3600),
                              "vision": pytest.approx(4260 * 8 / 3600)}
    assert part.goodput["ml"] == pytest.approx(rep.goodput) and part.goodput["vision"] is None
    assert (part.median_save_s, part.grace_s, part.jobs, part.runs) == (2.5, 10, 2, 5)
    assert part.scope == "all" and part.to_json()["scope"] == "all"
    assert since_arg("7d") == "now-7days" and since_arg("2026-11-01") == "2026-11-01"
    with pytest.raises(ReportError, match="--since 'last week'"):
        since_arg("last week")


@pytest.mark.parametrize("private, uid, level, scope", [
    ("jobs,usage,users", 1001, "None", "own"), ("jobs,usage,users", 1001, None, "own"),
    ("jobs", 1001, "Operator", "all"), ("Jobs,Usage", 1001, "Administrator", "all"),
    ("jobs,usage", 0, None, "all"), ("usage,users", 1001, "None", "all"), ("", 1001, None, "all"),
    ("none", 1001, "None", "all"),
])
def test_a_partition_report_says_when_privatedata_hides_other_users(
        private: str, uid: int, level: str | None, scope: str) -> None:
    # a sysadmin's report run as an ordinary user under PrivateData=jobs counts that
    # user's jobs only: it must say so, not pass them off as the partition's
    from hpctrain.commands.report_partition import format_partition
    from hpctrain.report.partition import aggregate, scope_of

    assert scope_of(private, uid, level) == scope
    text = format_partition(aggregate("debug", "7d", [], {}, {}, {}, 10, scope))
    assert ("only your own jobs are counted" in text) is (scope == "own")


def test_a_restart_that_failed_before_its_first_step_counts_in_the_next_ones_recovery() -> None:
    ledger = entries("restart cause=user_crash restart_count=0 attempt=1 at=116.0 "
                     "mode=inprocess\n"
                     "restart cause=user_crash restart_count=0 attempt=2 at=120.0 "
                     "mode=inprocess\n")
    events = [e for e in history() if e["attempt"] == 0]     # last step at 115
    events += [ev(122.0 + i, 0, 2, event="step", step=s, n=i + 1) for i, s in enumerate((4, 5))]
    r = build("42", RUNS[:1], ledger, events, final_cause="completed")
    _, failed, resumed = r.runs[0].attempts
    assert failed.steps == 0 and failed.recovery_s is None
    assert resumed.recovery_s == pytest.approx(6.0)          # 115 -> 121 (step 4 took 1 s)
    assert len(r.restarts("inprocess")) == 2 and r.recoveries("inprocess") == [6.0]


def test_a_run_slurm_resized_is_one_run_with_the_gpu_seconds_of_each_part() -> None:
    """sacct -X -D of a job with a spare node ([elastic]) as the devcluster recorded it: n2
    taken from the running job (a RESIZING row; the next starts as it ends), then n3 (no
    spare left: the job requeued, which closed the second RESIZING row), then completed.
    Two runs; the first held 6 GPUs, then 4."""
    from hpctrain.jobs.accounting import runs_from_rows

    def row(state: str, start: str, end: str, elapsed: int, nodes: str, gpus: int) -> dict:
        return {"JobID": "733", "State": state, "Submit": "2026-11-26T03:39:00",
                "Start": f"2026-11-26T{start}", "End": f"2026-11-26T{end}",
                "ElapsedRaw": str(elapsed), "NodeList": nodes,
                "AllocTRES": f"cpu={gpus},gres/gpu={gpus},node={gpus // 2}", "Partition": "wide"}

    runs = runs_from_rows([row("RESIZING", "03:39:05", "03:39:19", 14, "n[1-3]", 6),
                           row("RESIZING", "03:39:19", "03:39:36", 17, "n[1,3]", 4),
                           row("COMPLETED", "03:40:50", "03:40:59", 9, "n[1-3]", 6)])["733"]
    assert [(r.restart, r.state, r.nodes, r.gpus, r.elapsed_s) for r in runs] == [
        (0, "REQUEUED", "n[1-3]", 6, 31.0), (1, "COMPLETED", "n[1-3]", 6, 9.0)]
    assert runs[0].allocated_gpu_s == 14 * 6 + 17 * 4
    assert {r.partition for r in runs} == {"wide"}    # its facts: peak, price (report)
    assert build("733", runs, [], []).allocated_gpu_s == 14 * 6 + 17 * 4 + 9 * 6


def test_the_step_time_of_a_job_with_spares_counts_the_steps_gpus() -> None:
    """A spare node's GPUs are allocated and idle: the ledger's ``step`` line says the
    step ran on 4 of the 6 GPUs, and kept time counts those 4."""
    run = RunFacts(restart=0, state="COMPLETED", submit=0.0, start=100.0, end=200.0,
                   elapsed_s=100.0, nodes="n[1-3]", gpus=6)
    history = [{"restart": 0, "attempt": 0, "event": "step", "step": i, "t": 110.0 + 10 * i}
               for i in range(9)]
    plain = build("7", [run], [], history)
    spared = build("7", [run], [("step", {"restart_count": "0", "attempt": "0",
                                          "nodes": "n1,n2", "gpus": "4"})], history)
    assert spared.runs[0].working_gpus == 4 and plain.runs[0].working_gpus == 6
    assert spared.allocated_gpu_s == plain.allocated_gpu_s == 600
    assert spared.goodput == pytest.approx(plain.goodput * 4 / 6)


def test_the_report_says_what_the_spares_held_idle_and_what_they_replaced() -> None:
    """A job with a spare node that lost n2 at t=60 s: 6 GPUs for 60 s (4 at work), then
    4 after the node was taken from the job; one restart on the spare."""
    from hpctrain.commands.report import format_text

    run = RunFacts(restart=0, state="COMPLETED", submit=0.0, start=100.0, end=200.0,
                   elapsed_s=100.0, nodes="n[1-3]", gpus=6, gpu_s=60 * 6 + 40 * 4)
    ledger = [("step", {"restart_count": "0", "attempt": "0", "gpus": "4"}),
              ("restart", {"cause": "node_fail", "restart_count": "0", "attempt": "1",
                           "at": "165"}),
              ("step", {"restart_count": "0", "attempt": "1", "gpus": "4"})]
    history = [{"restart": 0, "attempt": 0, "event": "step", "step": i, "t": 110.0 + 10 * i}
               for i in range(5)]
    r = build("7", [run], ledger, history)
    assert (r.spare_gpu_s, r.spare_restarts) == (120.0, 1)
    assert "spare nodes: held 120 GPU-s idle (23.1% of the allocation); 1 lost node(s) " \
           "replaced by a spare in the allocation" in format_text(r)
    plain = build("7", [replace(run, gpus=4, gpu_s=None)], [], history)
    assert "spare nodes" not in format_text(plain)


def test_a_slow_nodes_extra_time_is_its_own_category_per_node_and_drawn() -> None:
    """Issue 56: 1 s steps from 200 s; n2 slow from step 16 (2 s steps), first seen slow
    at 219 s (the rank's median lags), named at 230 s and replaced: the next attempt runs
    1 s steps again. The slow stretch's time beyond the healthy 1 s is ``slow``, n2's."""
    from hpctrain.commands.report import format_text

    runs = [RunFacts(0, "COMPLETED", 190.0, 200.0, 300.0, 100.0, "n[1-3]", GPUS)]
    ledger = entries("slow node=n2 factor=2.00 own_s=2 others_s=1 restart_count=0 "
                     "attempt=0 at=230.0 action=replace since=219.0\n"
                     "restart cause=node_fail restart_count=0 attempt=1 at=233.0\n")
    t, events = 200.0, [ev(200.0, 0, 0, event="phase", phase="training")]
    for step in range(24):                  # 16 at 1 s, then 8 at 2 s
        t += 1.0 if step < 16 else 2.0
        events.append(ev(t, 0, 0, event="step", step=step, n=step + 1))
    events += [ev(240.0 + i, 0, 1, event="step", step=24 + i, n=i + 1) for i in range(10)]
    r = build("42", runs, ledger, events, final_cause="completed")
    first = r.runs[0].attempts[0]
    [(begin, end, node, extra)] = first.slow
    assert node == "n2" and extra == pytest.approx(8.0) and (begin, end) == (216.0, 232.0)
    assert r.slow_by_node == {"n2": pytest.approx(8.0 * GPUS)}
    assert r.gpu_s["slow"] == pytest.approx(8.0 * GPUS)
    assert sum(r.gpu_s.values()) == pytest.approx(r.allocated_gpu_s)
    assert "slow nodes: n2 32 GPU-s" in format_text(r)
    page = to_html(r)
    assert 'class="slow"' in page and "slowed by a slow node" in page
    # no slow line: nothing moved
    assert build("42", runs, ledger[1:], events).gpu_s["slow"] == 0


def slow_job(ledger_text: str):
    """10 steps of 1 s from 230 s, then 20 of 3 s: 40 s beyond the healthy pace."""
    runs = [RunFacts(0, "COMPLETED", 190.0, 200.0, 330.0, 130.0, "n[1-3]", GPUS)]
    t, events = 230.0, [ev(230.0, 0, 0, event="phase", phase="training")]
    for step in range(30):
        t += 1.0 if step < 10 else 3.0
        events.append(ev(t, 0, 0, event="step", step=step, n=step + 1))
    return build("42", runs, entries(ledger_text), events, final_cause="completed")


@pytest.mark.parametrize("lines", [
    "slow node=n2 factor=3 restart_count=0 attempt=0 at=255.0 action=report since=245.0\n"
    "slow node=n3 factor=3 restart_count=0 attempt=0 at=256.0 action=report since=246.0\n",
    "slow node=- factor=3 restart_count=0 attempt=0 at=255.0 action=report since=243.0\n"
    "slow node=n2 factor=3 restart_count=0 attempt=0 at=270.0 action=report since=260.0\n"])
def test_two_slow_lines_over_one_stretch_count_its_time_once(lines: str) -> None:
    """Two nodes named in one stretch, or the whole job and then a node: the steps' extra
    time counts once, for the first named (an adversarial run found it counted twice, and
    a category negative)."""
    r = slow_job(lines)
    assert r.gpu_s["slow"] == pytest.approx(20 * 2.0 * GPUS)
    assert sum(r.gpu_s.values()) == pytest.approx(r.allocated_gpu_s)
    assert all(v >= 0 for v in r.gpu_s.values()), r.gpu_s


def test_the_categories_never_sum_to_more_than_allocated() -> None:
    """The first step is credited the median step time, but never more than passed since
    the attempt began (a start-up shorter than a step made the sum pass the allocation)."""
    runs = [RunFacts(0, "COMPLETED", 190.0, 200.0, 300.0, 100.0, "n[1-3]", GPUS)]
    t, events = 200.0, [ev(200.0, 0, 0, event="phase", phase="training")]
    for step in range(30):
        t += 1.0 if step < 10 else 3.0
        events.append(ev(t, 0, 0, event="step", step=step, n=step + 1))
    r = build("42", runs, entries(""), events, final_cause="completed")
    assert sum(r.gpu_s.values()) == pytest.approx(r.allocated_gpu_s), r.gpu_s
