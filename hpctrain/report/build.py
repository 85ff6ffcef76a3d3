"""What a job did, run by run: where its allocated GPU-time went, and its goodput.

Pure: :func:`build` takes what was gathered (sacct's runs, the ledger's lines, rank 0's
progress history; ``hpctrain report`` gathers them) and returns a :class:`Report`.

A *run* is one start of the job by Slurm (a requeue starts the next); an *attempt* is one
start of the training step inside a run (the supervisor restarts it in place after a hang
or an allowed crash). Within an attempt, rank 0's history has a line per step boundary:

- **kept**: steps whose result survived (the last time each step id was completed);
- **re-done**: steps completed again later, after an interruption lost them;
- **start-up**: the attempt's start to its first step (imports, rendezvous, loading);
- **saving**: blocking checkpoint saves;
- **stopping**: the last step to the attempt's end (a hang's wait, an emergency save's
  tail, shutting down);
- **slow**: the steps' time beyond the attempt's healthy pace while a node was found slow
  (the ledger's ``slow`` lines: the stretch of steps slower than 1.25x the pace before it,
  around when the node was first seen slow), per node in :attr:`Report.slow_by_node`.

A restart in the allocation begins its attempt either in the running processes
(``inprocess``: hpctrain.runtime.run) or as a new training step (``new``); its *recovery*
is the previous attempt's stopping plus its own start-up: from the last step before the
failure to the first step after it.

Goodput = kept GPU-time / allocated GPU-time (each run's elapsed time x its GPUs; a run
Slurm took a lost node from counts each part with its own GPUs). Step time counts the GPUs
the step ran on: with ``[elastic]`` spare nodes (the ledger's ``step`` lines) the spares'
idle GPUs are allocated, not kept, so goodput includes what they cost. A job
whose script does not use hpctrain.runtime has no history: its runs, causes and times
are still reported, its goodput is unknown.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

CATEGORIES = ("kept", "slow", "redone", "startup", "saving", "stopping", "other")
SLOWED = 1.25        # a step this many times the healthy pace belongs to a slow stretch


@dataclass(frozen=True)
class RunFacts:
    """One run as sacct recorded it."""

    restart: int
    state: str
    submit: float | None
    start: float | None
    end: float | None
    elapsed_s: float
    nodes: str
    gpus: int
    gpu_s: float | None = None   # when the run's GPUs changed (Slurm took a lost node)
    partition: str = ""          # where it ran (its facts: peak TFLOPS, price)

    @property
    def allocated_gpu_s(self) -> float:
        return self.gpu_s if self.gpu_s is not None else self.elapsed_s * self.gpus


@dataclass
class Attempt:
    """One start of the training step, and what it did."""

    restart: int
    attempt: int
    begin: float
    end: float
    cause: str = ""                       # how it ended
    mode: str = ""                        # how it began: "" (the run's first), "inprocess"
    #                                       (runtime.run, same processes), "new" (a new step)
    recovery_s: float | None = None       # the last step before it to its first step
    steps: int = 0                        # step completions
    redone: int = 0
    first_step: int | None = None
    last_step: int | None = None
    first_at: float | None = None         # when its first and last step completed
    last_at: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)   # category -> s
    saving: list[tuple[float, float]] = field(default_factory=list)   # (from, to) of saves
    # (from, to, node, seconds beyond the healthy pace) of each stretch a node was slow
    slow: list[tuple[float, float, str, float]] = field(default_factory=list)
    gpus: int = 0                         # the GPUs its step ran on ([elastic]: the ledger's)
    shrunk: bool = False                  # ...fewer than the attempt before: no spare left


@dataclass
class RunReport:
    """One run: its queue wait, time, nodes, end and attempts."""

    restart: int
    state: str
    queue_s: float | None
    elapsed_s: float
    nodes: str
    gpus: int
    cause: str
    attempts: list[Attempt] = field(default_factory=list)
    step_gpus: int = 0    # the GPUs the step ran on, when fewer ([elastic] spares idle)

    @property
    def working_gpus(self) -> int:
        """The GPUs the run's step time counts: the step's, never more than allocated."""
        return min(self.step_gpus, self.gpus) if self.step_gpus else self.gpus


@dataclass
class Report:
    job: str
    runs: list[RunReport]
    allocated_gpu_s: float
    gpu_s: dict[str, float]               # category -> GPU-seconds
    kept_steps: int
    lost_steps: int
    step_s: float | None                  # median step time
    known: bool                           # rank 0's history was there
    points: list[tuple[float, int, bool]] = field(default_factory=list)  # (t, step, kept)
    note: str = ""        # what the last run's verdict adds: "rank 1 then died at exit (...)"
    spare_gpu_s: float = 0.0   # [elastic]: GPU-seconds the spare nodes held idle
    spare_restarts: int = 0    # ...and the node losses recovered on one, in the allocation
    shrinks: int = 0           # [elastic] min_nodes: node losses recovered on fewer nodes
    slow_by_node: dict[str, float] = field(default_factory=dict)   # GPU-s lost to a slow
    #                                                    node ("-": the whole job slowed)

    def restarts(self, mode: str) -> list[Attempt]:
        """The attempts a restart in the allocation began the ``mode`` way ("inprocess",
        "new")."""
        return [att for run in self.runs for att in run.attempts if att.mode == mode]

    def recoveries(self, mode: str) -> list[float]:
        """Seconds from the last step before each such restart to the first step after
        it, where both were seen (a restart that failed before its first step has none:
        its time counts in the next one's)."""
        return [att.recovery_s for att in self.restarts(mode) if att.recovery_s is not None]

    @property
    def goodput(self) -> float | None:
        if not self.known or not self.allocated_gpu_s:
            return None
        return self.gpu_s.get("kept", 0.0) / self.allocated_gpu_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "goodput": self.goodput}


def build(job: str, runs: Sequence[RunFacts], ledger: Sequence[tuple[str, Mapping[str, str]]],
          history: Sequence[Mapping[str, Any]], final_cause: str = "",
          note: str = "") -> Report:
    """The report of job ``job`` (see the module docstring); ``final_cause`` and ``note``
    from the supervisor's verdict on the last run."""
    reports = [_run(r, runs, ledger, final_cause) for r in runs]
    events = sorted(history, key=lambda e: e.get("t", 0.0))
    kept_at = _kept(events)
    steps_all = []
    for run in reports:
        for att in run.attempts:
            mine = [e for e in events if e.get("restart") == att.restart
                    and e.get("attempt") == att.attempt and att.begin - 1 <= e["t"] <= att.end]
            durations = _account(att, mine, kept_at)
            steps_all += durations
            _slow(att, mine, durations, _slow_lines(ledger, att))
    step_s = statistics.median(steps_all) if steps_all else None
    for run in reports:
        _recoveries(run.attempts)
    gpu_s = {c: 0.0 for c in CATEGORIES}
    slow_by_node: dict[str, float] = {}
    for run in reports:
        for att in run.attempts:
            gpus = _working(run, att)      # a shrunk attempt's time counts its fewer GPUs
            for cat, sec in att.seconds.items():
                gpu_s[cat] += sec * gpus
            for _, _, node, extra in att.slow:
                slow_by_node[node] = slow_by_node.get(node, 0.0) + extra * gpus
    allocated = sum(r.allocated_gpu_s for r in runs)
    spare = sum(max(0.0, r.allocated_gpu_s - sum((att.end - att.begin) * _working(rep, att)
                                                 for att in rep.attempts))
                for r, rep in zip(runs, reports) if rep.step_gpus)
    shrinks = sum(att.shrunk for run in reports for att in run.attempts)
    gpu_s["other"] = max(0.0, allocated - sum(v for k, v in gpu_s.items() if k != "other"))
    completions = [e for e in events if e.get("event") == "step"]
    points = [(e["t"], e["step"] if isinstance(e.get("step"), int) else e.get("n", 0),
               kept_at.get(_step_id(e)) == e["t"]) for e in completions]
    return Report(job, reports, allocated, gpu_s, kept_steps=len(kept_at),
                  lost_steps=len(completions) - len(kept_at), step_s=step_s,
                  known=bool(completions), points=points, note=note, spare_gpu_s=spare,
                  spare_restarts=sum(1 for k, f in ledger
                                     if k == "restart" and f.get("cause") == "node_fail")
                  - shrinks, shrinks=shrinks, slow_by_node=slow_by_node)


def _working(run: RunReport, att: Attempt) -> int:
    """The GPUs an attempt's step time counts: its step's ([elastic]: the ledger's, fewer
    after a shrink), never more than the run's allocation."""
    return min(att.gpus, run.gpus) if att.gpus else run.working_gpus


def _of_run(fields: Mapping[str, str], restart: int) -> bool:
    """Is a ledger line about run ``restart``? Its count compared as a number: the ledger
    is text, and a count written another way (``01``) is still the same run."""
    count = fields.get("restart_count", "")
    return count.isdigit() and int(count) == restart


def _run(run: RunFacts, runs: Sequence[RunFacts], ledger: Sequence[tuple[str, Mapping[str, str]]],
         final_cause: str) -> RunReport:
    """A run's report without its step accounting: attempts, queue wait, cause."""
    before = next((r for r in runs if r.restart == run.restart - 1), None)
    queued_from = before.end if before is not None and before.end else run.submit
    queue_s = run.start - queued_from if run.start and queued_from else None
    end = run.end or (run.start or 0.0) + run.elapsed_s
    restarts = sorted((int(f.get("attempt", "0")), float(f.get("at", "0")), f.get("cause", ""),
                       "inprocess" if f.get("mode") == "inprocess" else "new")
                      for k, f in ledger if k == "restart"
                      and _of_run(f, run.restart))
    begins = [(0, run.start or end, "", "")] + restarts
    attempts = []
    for i, (number, begin, _, mode) in enumerate(begins):
        stop = begins[i + 1][1] if i + 1 < len(begins) else end
        cause = begins[i + 1][2] if i + 1 < len(begins) else ""
        attempts.append(Attempt(run.restart, number, begin, stop, cause, mode))
    requeue = next((f.get("cause", "") for k, f in ledger if k == "requeue"
                    and _of_run(f, run.restart + 1)), "")
    cause = requeue or (final_cause if run is runs[-1] else "") or run.state.lower()
    attempts[-1].cause = cause
    placed = {int(f.get("attempt", "0") or 0): int(f["gpus"]) for k, f in ledger
              if k == "step" and _of_run(f, run.restart) and f.get("gpus", "").isdigit()}
    step_gpus = placed[min(placed)] if placed else 0
    width = step_gpus
    for att in attempts:           # an in-process attempt keeps its step's width
        att.gpus = placed.get(att.attempt, width)
        att.shrunk = bool(width) and att.gpus < width
        width = att.gpus
    return RunReport(run.restart, run.state, queue_s, run.elapsed_s, run.nodes, run.gpus,
                     cause, attempts, step_gpus)


def _recoveries(attempts: Sequence[Attempt]) -> None:
    """Each attempt's recovery: the stopping of the last attempt before it that made a
    step, the whole of those between (they failed before their first step), its start-up."""
    before: Attempt | None = None
    between = 0.0
    for att in attempts:
        if not att.steps:
            between += att.end - att.begin
            continue
        if before is not None:
            att.recovery_s = before.seconds["stopping"] + between + att.seconds["startup"]
        before, between = att, 0.0


def _kept(events: Sequence[Mapping[str, Any]]) -> dict[Any, float]:
    """Step id -> the time of its last completion (the one whose result was kept)."""
    kept: dict[Any, float] = {}
    for e in events:
        if e.get("event") == "step":
            kept[_step_id(e)] = e["t"]
    return kept


def _step_id(e: Mapping[str, Any]) -> Any:
    return e["step"] if e.get("step") is not None else ("n", e.get("restart"), e.get("n"))


def _account(att: Attempt, events: Sequence[Mapping[str, Any]],
             kept_at: Mapping[Any, float]) -> list[float]:
    """Fill one attempt's seconds per category from its history; its step durations."""
    saving = _saving_intervals(events, att.end)
    att.saving = saving
    steps = [e for e in events if e.get("event") == "step"]
    secs = {c: 0.0 for c in CATEGORIES if c != "other"}
    secs["saving"] = sum(b - a for a, b in saving)
    if not steps:
        secs["startup"] = max(0.0, att.end - att.begin - secs["saving"])
        att.seconds = secs
        return []
    durations = []
    for prev, e in zip(steps, steps[1:]):
        durations.append(max(0.0, e["t"] - prev["t"] - _overlap(saving, prev["t"], e["t"])))
    # the first step's time: the median step, but never more than began with the attempt
    first = min(statistics.median(durations) if durations else 0.0,
                max(steps[0]["t"] - att.begin, 0.0))
    for i, e in enumerate(steps):
        took = durations[i - 1] if i else first
        kept = kept_at.get(_step_id(e)) == e["t"]
        secs["kept" if kept else "redone"] += took
        att.redone += not kept
    secs["startup"] = max(0.0, steps[0]["t"] - att.begin - first
                          - _overlap(saving, att.begin, steps[0]["t"]))
    secs["stopping"] = max(0.0, att.end - steps[-1]["t"] - _overlap(saving, steps[-1]["t"],
                                                                      att.end))
    att.steps = len(steps)
    att.first_step, att.last_step = steps[0].get("step"), steps[-1].get("step")
    att.first_at, att.last_at = steps[0]["t"], steps[-1]["t"]
    att.seconds = secs
    return durations


def _slow_lines(ledger: Sequence[tuple[str, Mapping[str, str]]],
                att: Attempt) -> list[tuple[str, float, float]]:
    """(node, since, at) of each slow node the ledger names in ``att`` (``-``: the job)."""
    out = []
    for kind, f in ledger:
        if kind == "slow" and _of_run(f, att.restart) and f.get("attempt", "0") == \
                str(att.attempt):
            try:
                out.append((f.get("node", "-"), float(f["since"]), float(f["at"])))
            except (KeyError, ValueError):
                continue
    return out


def _slow(att: Attempt, events: Sequence[Mapping[str, Any]], durations: Sequence[float],
          found: Sequence[tuple[str, float, float]]) -> None:
    """Move each slow stretch's time beyond the healthy pace from the steps' categories
    to ``slow``. The healthy pace: the median step before the node was first seen slow
    (fewer than 3 such steps: not known, nothing moved); the stretch: the steps around
    that moment slower than SLOWED times it, back to where they began (the detector sees
    a slowdown a few steps late) and on to where they end."""
    steps = [e for e in events if e.get("event") == "step"][1:]   # durations[i] ends steps[i]
    counted: set[int] = set()       # a step in two stretches (two nodes, a node and the
    for node, since, at in found:   # whole job) counts once, for the first named
        before = [d for e, d in zip(steps, durations) if e["t"] < since]
        if len(before) < 3:
            continue
        healthy = statistics.median(before)
        slowed = [d > SLOWED * healthy for d in durations]
        near = min(range(len(steps)), key=lambda i: abs(steps[i]["t"] - since), default=None)
        if near is None or not slowed[near]:
            near = next((i for i, e in enumerate(steps) if e["t"] >= since and slowed[i]),
                        None)
        if near is None:
            continue
        first = last = near
        while first > 0 and slowed[first - 1]:
            first -= 1
        while last + 1 < len(steps) and slowed[last + 1]:
            last += 1
        mine = [i for i in range(first, last + 1) if i not in counted]
        counted.update(mine)
        extra = sum(durations[i] - healthy for i in mine)
        if not mine:
            continue
        begin = steps[first]["t"] - durations[first]
        att.slow.append((begin, steps[last]["t"], node, extra))
        moved = min(extra, att.seconds.get("kept", 0.0))
        att.seconds["kept"] = att.seconds.get("kept", 0.0) - moved
        att.seconds["redone"] = att.seconds.get("redone", 0.0) - (extra - moved)
        att.seconds["slow"] = att.seconds.get("slow", 0.0) + extra


def _saving_intervals(events: Sequence[Mapping[str, Any]], end: float) -> list[tuple[float, float]]:
    out, since = [], None
    for e in events:
        if e.get("event") != "phase":
            continue
        if e.get("phase") == "saving" and since is None:
            since = e["t"]
        elif e.get("phase") != "saving" and since is not None:
            out.append((since, e["t"]))
            since = None
    if since is not None:
        out.append((since, end))
    return out


def _overlap(intervals: Sequence[tuple[float, float]], a: float, b: float) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in intervals)
