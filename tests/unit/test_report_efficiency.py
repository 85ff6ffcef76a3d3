"""Efficiency and cost measured (issue 43): the work a step does travels from
``ctx.set_work`` (checked in hpctrain.runtime.work) through the progress record and rank 0's
history to ``hpctrain report``: throughput, MFU against the partition's peak, GPU-hours and
cost at its price, beside ``hpctrain plan``'s estimate for the same work; in the JSON, the
text and the HTML page (a throughput-over-time plot on the timeline's axis)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from hpctrain import protocol as p
from hpctrain.commands.report_efficiency import efficiency, text_lines
from hpctrain.planner.cost import estimate
from hpctrain.protocol.progress import Progress, Work
from hpctrain.report.build import RunFacts, build
from hpctrain.report.efficiency import Facts, measure
from hpctrain.report.html import to_html
from hpctrain.runtime.progress import Reporter
from hpctrain.runtime.work import make_work

GPUS, PEAK, PRICE = 4, 312.0, 2.0
FACTS = Facts("debug", PEAK, PRICE, "USD", emulated=True)
RUN = [RunFacts(0, "COMPLETED", 90.0, 100.0, 200.0, 100.0, "n[1-2]", GPUS)]


def ev(t: float, **kw: object) -> dict:
    return {"t": t, "restart": 0, "attempt": 0, **kw}


def history(work: Work | None = Work(1000.0, "tokens", params=1e6)) -> list[dict]:
    """Start-up, 2 steps before the script says its work, then 20 steps of 1 s."""
    out = [ev(100.0, event="phase", phase="startup"), ev(108.0, event="step", step=0, n=1),
           ev(109.0, event="step", step=1, n=2)]
    if work is not None:
        out.append(ev(109.5, event="work", **work.fields()))
    out += [ev(110.0 + i, event="step", step=2 + i, n=3 + i) for i in range(20)]
    return out


def test_the_step_work_is_checked_where_the_script_says_it() -> None:
    assert make_work(tokens=4096, params=7e9) == Work(4096.0, "tokens", 0.0, 7e9, "train")
    assert make_work(samples=32, flops_per_sample=1e9).unit == "samples"
    # the spec's [model] params when the script gives no FLOPs
    assert make_work(tokens=8, spec_params=1.3e9, mode="lora") == Work(8.0, "tokens", 0.0,
                                                                        1.3e9, "lora")
    assert make_work(tokens=8, flops_per_token=10, spec_params=1e9).params == 0
    for bad, match in (({}, "give tokens= .* or samples=, one of them"),
                       ({"tokens": 1, "samples": 1}, "one of them"),
                       ({"tokens": 0}, "tokens=0 must be a number > 0"),
                       ({"tokens": True}, "tokens=True must be a number > 0"),
                       ({"tokens": float("nan")}, "tokens=nan must be"),
                       ({"tokens": 8, "flops_per_sample": 3}, "with tokens= give "
                                                              "flops_per_token=, not "
                                                              "flops_per_sample="),
                       ({"samples": 8, "params": -1}, "params=-1 must be a number > 0")):
        with pytest.raises(ValueError, match=match):
            make_work(**bad)


def test_the_work_travels_in_the_progress_record_and_rank_0s_history(tmp_path: Path) -> None:
    work = Work(2048.0, "tokens", 0.0, 7e9, "train")
    assert Work.parse(work.fields()) == work
    assert Work.parse({"work": "x"}) is None and Work.parse({}) is None
    assert Work.parse({"work": "5", "work_unit": "bytes"}) is None
    reporter = Reporter(str(tmp_path), 0, run_id="r", beat_s=60)
    reporter.set_work(work)
    reporter.set_work(work)              # the same again: one history line, not two
    record = Progress.parse(reporter.record())
    assert record is not None and record.work == work
    assert Progress.parse({**reporter.record(), "work": ""}).work is None
    reporter.drain()
    said = [e for e in p.read_history(tmp_path) if e.get("event") == "work"]
    assert len(said) == 1 and Work.parse(said[0]) == work


def test_throughput_mfu_gpu_hours_and_cost_are_measured() -> None:
    r = build("7", RUN, [], history())
    eff = measure(r, [(109.5, 1000.0)], "tokens", 6e6, FACTS)
    # 20 steps of 1000 tokens after the work was said (the 2 before count none)
    assert (eff.work_done, eff.work_kept) == (20000.0, 20000.0)
    assert eff.step_s == pytest.approx(22.0)             # every step's second, said or not
    assert eff.throughput == pytest.approx(20000 / 22)
    assert eff.mfu == pytest.approx(20000 * 6e6 / (22 * GPUS * PEAK * 1e12))
    assert eff.allocation_mfu == pytest.approx(20000 * 6e6 / (100 * GPUS * PEAK * 1e12))
    assert eff.gpu_hours == pytest.approx(400 / 3600)
    assert eff.cost == pytest.approx(400 / 3600 * PRICE)
    assert eff.series and all(v == pytest.approx(1000.0) for _, v in eff.series[1:])
    # nothing said: no throughput, no MFU; the GPU-hours and cost still
    none = measure(build("7", RUN, [], history(None)), [], "", None, FACTS)
    assert (none.unit, none.throughput, none.mfu, none.series) == ("", None, None, [])
    assert none.gpu_hours == eff.gpu_hours
    # no price, no peak: no cost, no MFU
    bare = measure(r, [(109.5, 1000.0)], "tokens", 6e6, Facts("x"))
    assert (bare.cost, bare.mfu, bare.allocation_mfu) == (None, None, None)


def test_report_gives_the_flops_from_params_and_plans_estimate_beside_the_measure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import hpctrain.commands.report_efficiency as gather

    monkeypatch.setattr(gather, "partition_facts", lambda name: FACTS)
    r = build("7", RUN, [], history())
    eff = efficiency(r, history(), "debug")
    assert eff.flops_per_unit == 6e6              # 6 x 1e6 params per token, to train
    plan = estimate("train", 1e6, 20000, PEAK, GPUS, price_per_gpu_hour=PRICE)
    assert eff.estimate is not None
    assert (eff.estimate.gpu_hours, eff.estimate.mfu, eff.estimate.cost) == pytest.approx(
        (plan.gpu_hours, plan.mfu, plan.cost))
    lines = text_lines(eff)
    assert lines[0].startswith("throughput: 909 tokens/s over 22.0 s of steps (20k tokens, "
                               "20k kept) (CPU figures: partition debug's GPUs are emulated")
    assert lines[1] == ("MFU: 0.00044% of 312 TFLOPS per GPU while stepping, 9.6e-05% of "
                        "the whole allocation (6M model FLOPs per token)")
    assert lines[2] == "GPU-hours: 0.111 allocated, 0.222 USD at 2 USD per GPU-hour"
    assert lines[3].startswith(f"plan's estimate for the 20k tokens kept: "
                               f"{plan.gpu_hours:.3g} GPU-hours at 40% MFU")
    # in the JSON, whole
    data = json.loads(json.dumps(asdict(eff)))
    assert data["throughput"] == pytest.approx(20000 / 22) and data["facts"]["emulated"]
    assert data["estimate"]["mfu"] == 0.4
    # the HTML page: the figures, the caveat and the plot on the timeline's axis
    page = to_html(r, eff)
    assert 'id="efficiency"' in page and 'id="throughput"' in page and "<polyline" in page
    assert "CPU figures" in page and "909 tokens/s while stepping" in page
    assert "0.222 USD" in page and "40% (assumed)" in page
    # unknown: said so, with what to do
    bare = efficiency(build("7", RUN, [], history(None)), history(None), "debug")
    assert text_lines(bare)[0].startswith("throughput: unknown (the script did not say")
    assert "no throughput over time" in to_html(r, bare)
