"""The hang watchdog's judgement, as pure functions of what the ranks reported.

Two sources of progress, best first:

- the runtime's progress records (:mod:`hpctrain.runtime.progress`): per rank, its step,
  step boundaries, phase and heartbeat. A rank is hung when it has not advanced for its
  phase's timeout: ``startup`` and ``loading`` get ``startup_s`` (counted from the step's
  start), ``saving``/``exiting`` ``save_s``, ``training`` ``hang_s``.
- for a script that does not use the runtime: the job log's growth. Weaker: it cannot
  tell start-up from training, nor name a rank, and a script that prints nothing for a
  while looks hung. So it is off unless ``hang_timeout_s`` is set in the spec.

Which ranks stopped first: those that never reported, those whose heartbeat stopped (the
process is frozen or its node gone), those behind the others, and, once the stacks are in,
those that are not inside a ``torch.distributed`` call while the others wait in one.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from hpctrain import protocol as p
from hpctrain.protocol.progress import Progress
from hpctrain.protocol.records import ExitRecord

# the runtime is used and the spec says nothing: these defaults
AUTO_HANG_S, AUTO_STARTUP_S, AUTO_SAVE_S = p.DEFAULT_HANG_S, p.DEFAULT_STARTUP_S, p.DEFAULT_SAVE_S
STALE_BEATS = 5         # a heartbeat older than this many beats: the process stopped
EXIT_GRACE_S = 60.0     # every rank's work is over (phase exited) but the step goes on
# hang_timeout_s left out: once the steps are timed, HANG_STEPS steps' time (or PAUSES
# times the longest pause seen), within [HANG_FLOOR_S, AUTO_HANG_S]; timed from MIN_STEPS
# step boundaries on
HANG_STEPS, PAUSES, HANG_FLOOR_S, MIN_STEPS = 10, 3, 30.0, 5
OUTPUT = "output"       # the phase of a hang seen in the log (no progress records)


@dataclass(frozen=True)
class Limits:
    """Timeouts in seconds; None is off. ``plain`` applies them to log output as well."""

    hang_s: float | None = AUTO_HANG_S
    startup_s: float | None = AUTO_STARTUP_S
    save_s: float | None = AUTO_SAVE_S
    plain: bool = False           # hang_timeout_s was given: watch plain scripts' output too
    beat_s: float = 2.0
    derived: bool = False         # hang_timeout_s was left out: it follows the step time
    collective_s: float | None = None   # the training's collective timeout, when the job has one
    step_hang_s: float | None = None    # derived: the hang timeout of a training step

    @classmethod
    def from_spec(cls, hang_s: int | None, startup_s: int | None, save_s: int | None,
                  beat_s: float, collective_s: int | None = None) -> Limits:
        """The spec's ``[watchdog]`` (None: the default, 0: off)."""
        def pick(value: int | None, default: float | None) -> float | None:
            return default if value is None else (float(value) or None)

        hang = pick(hang_s, AUTO_HANG_S)
        return cls(hang, pick(startup_s, AUTO_STARTUP_S if hang else None),
                   pick(save_s, AUTO_SAVE_S if hang else None),
                   plain=bool(hang_s), beat_s=beat_s, derived=hang_s is None,
                   collective_s=float(collective_s) if collective_s else None)

    def timed(self, step_s: float | None, pause_s: float = 0.0) -> Limits:
        """These limits once a step takes ``step_s`` (None: not known yet) and the longest
        pause between steps seen was ``pause_s``: a hang timeout left to hpctrain becomes,
        for training steps, HANG_STEPS steps' time or PAUSES times that pause, at least
        HANG_FLOOR_S and at most the default; one the spec gave stays as given. Work
        between steps (``ctx.between_steps``) keeps the whole hang timeout."""
        if not self.derived or step_s is None or self.hang_s is None:
            return self
        derived = max(HANG_STEPS * step_s, PAUSES * pause_s, HANG_FLOOR_S)
        return replace(self, step_hang_s=min(derived, self.hang_s))

    def of(self, phase: str) -> float | None:
        if phase in ("startup", "loading"):
            return self.startup_s
        if phase in ("saving", "exiting"):
            return self.save_s
        if phase == "training" and self.step_hang_s is not None:
            return self.step_hang_s
        return self.hang_s

    @property
    def any(self) -> bool:
        return any(x is not None for x in (self.hang_s, self.startup_s, self.save_s))


@dataclass
class StepClock:
    """How long a training step takes, from the slowest rank's step boundaries as the
    watchdog sees them: the time between two looks at which the count moved, over the
    steps it moved by; the median of the last few. Only time every rank spent training
    counts (a save, an evaluation in ``ctx.between_steps`` have their own limits). The
    longest such time is kept too: a long pause inside the training that came back (an
    evaluation not marked as one) must not look like a hang the next time."""

    known: float | None = None    # the pace an earlier attempt of the same processes had
    longest_s: float = 0.0        # the longest time the count stood still, then moved
    rates: list[float] = field(default_factory=list)   # seconds per step, the last few
    moved: int = 0                # step boundaries timed
    last: tuple[float, int] | None = None   # (when, boundaries) the count last moved

    def add(self, now: float, boundaries: int) -> None:
        """Every rank is training and the slowest has passed ``boundaries``."""
        if self.last is None or boundaries < self.last[1]:
            self.last = (now, boundaries)    # the first look, or the ranks started over
            return
        at, before = self.last
        if boundaries > before:
            self.rates = [*self.rates[-19:], (now - at) / (boundaries - before)]
            self.longest_s = max(self.longest_s, now - at)
            self.moved += boundaries - before
            self.last = (now, boundaries)

    def skip(self) -> None:
        """Some rank is not training (saving, between steps): this stretch is not timed."""
        self.last = None

    def step_s(self) -> float | None:
        """Seconds per step, or None before MIN_STEPS boundaries were timed (and no
        earlier attempt's pace is known)."""
        if self.moved < MIN_STEPS or len(self.rates) < 2:
            return self.known
        return statistics.median(self.rates)


@dataclass(frozen=True)
class Hang:
    """What the watchdog found: no progress for longer than the phase allows."""

    phase: str
    idle_s: float
    limit_s: float
    ranks: tuple[int, ...] = ()      # the rank(s) that stopped first, as far as known
    nodes: tuple[str, ...] = ()
    why: str = ""                    # how those ranks were told apart
    frozen_nodes: tuple[str, ...] = ()  # nodes whose ranks stopped answering at all
    detected_at: float = 0.0

    def text(self) -> str:
        """``no progress in phase training for 11 s (limit 10 s); stopped first: rank(s) 3
        on n1 (behind the other ranks)``."""
        who = f"; stopped first: rank(s) {ranks_text(self.ranks)}" if self.ranks else ""
        where = f" on {','.join(self.nodes)}" if self.nodes else ""
        why = f" ({self.why})" if self.why and self.ranks else ""
        if self.phase == "exited":
            return (f"every rank's work is over, but the step has not ended for "
                    f"{self.idle_s:.0f} s (limit {self.limit_s:.0f} s): its exit hangs")
        if self.phase == OUTPUT:
            return (f"no output from the step for {self.idle_s:.0f} s (limit "
                    f"{self.limit_s:.0f} s; it does not report progress through "
                    f"hpctrain.runtime){who}{where}{why}")
        return (f"no progress in phase {self.phase} for {self.idle_s:.0f} s "
                f"(limit {self.limit_s:.0f} s){who}{where}{why}")


def ranks_text(ranks: tuple[int, ...]) -> str:
    """``0,1,5`` or, for runs of three and more, ``0-4094,4096``: at 8,192 ranks the
    ranks waiting for a hung one fit in a log line."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts.extend(map(str, ordered[i:j + 1]))
        i = j + 1
    return ",".join(parts)


def assess(progress: Mapping[int, Progress], world: int, started_at: float, now: float,
           limits: Limits, output_at: float | None = None,
           watched: Collection[int] | None = None) -> Hang | None:
    """A :class:`Hang` when some rank has not progressed for its phase's limit, else None.

    ``progress``: this attempt's records by rank; ``started_at``: when the step started;
    ``output_at``: the job log's last growth (plain scripts: no records at all);
    ``watched``: the ranks to judge (all ``world`` of them when None; those whose records
    can be read while the progress channel is silent, :mod:`hpctrain.supervisor.silence`)."""
    if not progress:
        return _assess_output(started_at, now, limits, output_at)
    judged = range(world) if watched is None else sorted(watched)
    exited = [rec for rec in progress.values() if rec.phase == "exited"]
    if len(exited) == len(judged):
        # every rank's work is over, yet the step runs: its teardown hangs (a destructor,
        # a library's exit handler); nothing is lost by ending it
        idle = now - max(rec.changed_at for rec in exited)
        return Hang("exited", idle, EXIT_GRACE_S, detected_at=now) \
            if idle > EXIT_GRACE_S else None
    overdue: list[tuple[float, int]] = []
    for rank in judged:
        rec = progress.get(rank)
        if rec is not None and rec.phase == "exited":
            continue   # done: it waits for nobody, and nobody waits for it
        phase = rec.phase if rec else "startup"
        last = max(rec.changed_at, started_at) if rec else started_at
        limit = limits.of(phase)
        if limit is not None and now - last > limit:
            overdue.append((now - last, rank))
    if not overdue:
        return None
    idle, first = max(overdue)
    rec = progress.get(first)
    phase = rec.phase if rec else "startup"
    ranks, why = suspect_ranks(progress, world, now, limits.beat_s, judged)
    nodes = tuple(dict.fromkeys(progress[r].node for r in ranks if r in progress
                                and progress[r].node))
    frozen = tuple(dict.fromkeys(progress[r].node for r in ranks
                                 if r in progress and _stale(progress[r], now, limits.beat_s)
                                 and progress[r].node))
    return Hang(phase, idle, limits.of(phase) or 0.0, ranks, nodes, why, frozen, now)


WAITED = "the others gave up waiting for them in a collective"


def waited(words: Iterable[str]) -> bool:
    """Do the failed ranks' words (``hpctrain.runtime.run``) say they waited for others:
    one at least gave up waiting in a collective (``timeout``) and the rest did so too or
    lost a peer that did (``peer``: its connections closed as it left)? A ``crash`` among
    them is a failure of its own."""
    said = set(words)
    return "timeout" in said and said <= {"timeout", "peer"}


def waited_for(records: Mapping[int, Progress], world: int, now: float,
               beat_s: float, collective_s: float | None = None) -> Hang | None:
    """A failed attempt (``hpctrain.runtime.run``) whose failed ranks all gave up waiting in
    a collective (their word ``timeout``) is a hang of the ranks that did not fail: a
    :class:`Hang` naming those (their nodes; frozen when their heartbeat stopped). None
    when some rank failed on its own (a crash: the failure path)."""
    failed = {r for r, rec in records.items() if rec.phase == "restarting"}
    if not waited(records[r].failed for r in failed):
        return None
    return _waited_on(tuple(r for r in range(world) if r not in failed), records, now,
                      beat_s, collective_s)


def gave_up(record: ExitRecord | None, records: Mapping[int, Progress], world: int,
            now: float, beat_s: float, collective_s: float | None = None) -> Hang | None:
    """The step ended because a rank gave up waiting in a collective (the crash record
    says ``waited=1``: ``hpctrain.runtime.init``, no in-process restart): a hang of the
    ranks that never said their work ended (their launcher stopped them), as far as the
    records tell. None for any other end."""
    if record is None or not record.waited:
        return None
    ranks = tuple(r for r in range(world) if r not in records or not records[r].exit)
    return _waited_on(ranks if len(ranks) < world else (), records, now, beat_s, collective_s)


def _waited_on(ranks: tuple[int, ...], records: Mapping[int, Progress], now: float,
               beat_s: float, collective_s: float | None) -> Hang:
    """The hang of ``ranks``, which others waited for in a collective until it timed out."""
    progress = {r: records[r] for r in ranks if r in records}
    nodes = tuple(dict.fromkeys(progress[r].node for r in progress if progress[r].node))
    frozen = tuple(dict.fromkeys(rec.node for rec in progress.values()
                                 if _stale(rec, now, beat_s) and rec.node))
    idle = now - min((rec.changed_at for rec in progress.values()), default=now)
    phase = progress[ranks[0]].phase if ranks and ranks[0] in progress else "training"
    return Hang(phase, idle, collective_s or idle, ranks, nodes, WAITED if ranks else "",
                frozen, now)


def _assess_output(started_at: float, now: float, limits: Limits,
                   output_at: float | None) -> Hang | None:
    if not limits.plain or limits.hang_s is None:
        return None
    last = max(output_at or started_at, started_at)
    limit = limits.hang_s if output_at and output_at > started_at else \
        max(limits.hang_s, limits.startup_s or 0)
    if now - last <= limit:
        return None
    return Hang(OUTPUT, now - last, limit, detected_at=now)


def _stale(rec: Progress, now: float, beat_s: float) -> bool:
    return now - rec.beat_at > max(STALE_BEATS * beat_s, 10.0)


def suspect_ranks(progress: Mapping[int, Progress], world: int, now: float,
             beat_s: float, judged: Iterable[int] | None = None
             ) -> tuple[tuple[int, ...], str]:
    """(ranks, how told apart) of the rank(s) that stopped progressing first, from the
    records alone (of the ``judged`` ranks, all ``world`` by default); ((), "") when every
    rank stands at the same place."""
    judged = tuple(range(world) if judged is None else judged)
    silent = tuple(r for r in judged if r not in progress)
    if silent and len(silent) < len(judged):
        return silent, "never reported: still starting, or stuck before hpctrain.runtime.init()"
    frozen = tuple(r for r in sorted(progress) if _stale(progress[r], now, beat_s))
    if frozen and len(frozen) < len(progress):
        return frozen, "heartbeat stopped: the process is frozen or its node is gone"
    marks = {r: rec.mark for r, rec in progress.items()}
    low = min(marks.values())
    behind = tuple(r for r in sorted(marks) if marks[r] == low)
    if len(behind) < len(marks):
        return behind, "behind the other ranks"
    return (), ""


# ---- stacks -----------------------------------------------------------------------------
_MAIN = re.compile(r"^--- main thread ---$", re.M)
# frames of a rank waiting for the others: a torch.distributed or DeepSpeed call, or
# backward() (DDP's gradient all-reduce runs inside it, where Python shows only autograd)
_COLLECTIVE = ("torch/distributed/", "deepspeed/comm/", "torch/autograd/")


def main_stack(stacks: str) -> str:
    """The main thread's part of one rank's stack dump."""
    m = _MAIN.search(stacks)
    if not m:
        return ""
    rest = stacks[m.end():]
    nxt = rest.find("\n--- ")
    return rest if nxt < 0 else rest[:nxt]


def node_of(stacks: str) -> str:
    """The node in a stack dump's first line (``rank 3 on n2 (pid 7), ...``); '' if none."""
    m = re.match(r"rank \d+ on (\S+)", stacks)
    return m.group(1) if m and m.group(1) != "?" else ""


def in_collective(stacks: str) -> bool:
    """Is the main thread inside a torch.distributed (or DeepSpeed comm) call?"""
    return any(marker in main_stack(stacks) for marker in _COLLECTIVE)


def innermost(stacks: str) -> str:
    """The main thread's innermost frame: ``File "train.py", line 42, in step`` (Python's
    order, innermost last), or py-spy's ``step (train.py:42)`` (innermost first)."""
    lines = [ln.strip() for ln in main_stack(stacks).splitlines() if ln.strip()]
    frames = [ln for ln in lines if ln.startswith("File ")]
    if frames:
        return frames[-1]
    return lines[0] if lines else ""


def culprits(stacks: Mapping[int, str], world: int, known: set[int] | None = None
             ) -> tuple[tuple[int, ...], str]:
    """(ranks, why) from the ranks' stack dumps: those that did not answer (of the
    ``known`` ones, which have reported progress: the others could not answer anyway),
    else those outside any collective while others wait in one; ((), "") when that tells
    nothing."""
    answered = set(stacks)
    mute = tuple(r for r in range(world) if r not in answered
                 and (known is None or r in known))
    if mute and answered:
        return mute, "did not answer the stack request (frozen holding the GIL, stopped, " \
                     "or its node is gone)"
    waiting = {r for r, text in stacks.items() if in_collective(text)}
    # a dump without the main thread's frames (py-spy came back empty) says nothing
    outside = tuple(sorted(r for r in answered - waiting if main_stack(stacks[r]).strip()))
    if waiting and outside:
        where = innermost(stacks[outside[0]])
        return outside, ("not in a collective while rank(s) "
                         f"{ranks_text(tuple(waiting))} wait in one"
                         + (f"; rank {outside[0]} is at {where}" if where else ""))
    return (), ""
