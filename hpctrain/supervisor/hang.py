"""The supervisor's hang watchdog at work: read the ranks' progress (from the progress
board, :mod:`hpctrain.supervisor.board`; or the job log's growth), judge it
(:mod:`hpctrain.supervisor.watchdog`, pure), and when the step is hung collect every
rank's Python stacks into the job log, name the rank(s) that stopped first, and kill the
step so it can be restarted.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from hpctrain import protocol as p
from hpctrain.errors import SlurmError
from hpctrain.supervisor.board import SUMMARY_S, Board
from hpctrain.supervisor.elastic import silent_nodes
from hpctrain.supervisor.finish import Finish
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.scheduler import Scheduler, StepProcess
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.watchdog import (Hang, Limits, RankProgress, StepClock, assess,
                                          culprits, gave_up, innermost, node_of,
                                          ranks_text, waited, waited_for)

LOOK_S = 1.0            # how often progress is looked at
FAILED_LOOK_S = 0.5     # how often ranks waiting to restart in-process are looked for
SETTLE_S, MAX_SETTLE_S = 1.0, 5.0   # ranks timing out in a collective: wait for the rest
KILL_WAIT_S = 60.0      # how long a killed step may take to end
STACK_LINES = 60        # lines of one rank's stacks printed into the job log
FINISH_WAIT_S = 0.5     # the ranks' last words, sent as the step ended, still arriving
FULL_STACKS = 8         # ranks whose stacks are printed whole (the others: a line per frame)


class Watch:
    """One attempt of the step, watched: ``look()`` returns a :class:`Hang` or None."""

    def __init__(self, slurm: Scheduler, state: StateDir, limits: Limits, world: int,
                 restart_count: int, attempt: int, logs: tuple[str, ...],
                 nodes: int, board: Board) -> None:
        self.slurm, self.board = slurm, board
        self.state, self.limits, self.world, self.nodes = state, limits, world, nodes
        self.restart_count, self.attempt = restart_count, attempt
        self.started_at = slurm.time()
        self.logs = tuple(log for log in dict.fromkeys(logs) if log)
        self._sizes = self._log_sizes()
        self.output_at: float | None = None
        self._next = slurm.monotonic() + LOOK_S
        self._next_failed = 0.0
        self._next_silent = 0.0
        self._next_summary, self._summary = 0.0, ""
        self.clock = StepClock()     # the step time: a hang timeout left out follows it

    def records(self) -> dict[int, dict[str, str]]:
        """This attempt's progress records by rank, as the ranks sent them."""
        out = {}
        for record in self.board.records().values():
            if record.get("run_id") != self.state.run_id or \
                    record.get("restart_count") != str(self.restart_count) or \
                    record.get("attempt") != str(self.attempt) or \
                    not record.get("rank", "").isdigit():
                continue
            out[int(record["rank"])] = record
        return out

    def progress(self) -> dict[int, RankProgress]:
        """This attempt's progress records by rank, parsed."""
        parsed = (RankProgress.parse(record) for record in self.records().values())
        return {rec.rank: rec for rec in parsed if rec is not None}

    def silent(self, nodes: list[str]) -> tuple[str, ...]:
        """[elastic] At most every LOOK_S: the step's ``nodes`` whose every rank went
        silent (a lost node, :func:`hpctrain.supervisor.elastic.silent_nodes`)."""
        if not nodes or self.slurm.monotonic() < self._next_silent:
            return ()
        self._next_silent = self.slurm.monotonic() + LOOK_S
        return silent_nodes(self.records(), nodes, self.slurm.time(), self.limits.beat_s)

    def failed(self) -> dict[int, dict[str, str]]:
        """At most every FAILED_LOOK_S: this attempt's ranks whose attempt failed in their
        process and that wait for the supervisor's word (``hpctrain.runtime.run``), by rank."""
        if self.slurm.monotonic() < self._next_failed:
            return {}
        self._next_failed = self.slurm.monotonic() + FAILED_LOOK_S
        return self.failed_now()

    def inprocess(self) -> bool:
        """Can every rank of this attempt start its next one in its own process?"""
        records = self.records()
        return len(records) == self.world and all(r.get("inprocess") == "1"
                                                  for r in records.values())

    def next(self) -> Watch:
        """The watch of the next attempt, in the same step (an in-process restart)."""
        watch = Watch(self.slurm, self.state, self.limits, self.world, self.restart_count,
                      self.attempt + 1, self.logs, self.nodes, self.board)
        # the same processes: the same pace, the same pauses
        watch.clock = StepClock(known=self.clock.step_s(), longest_s=self.clock.longest_s)
        return watch

    def summarize(self) -> None:
        """At most every SUMMARY_S, rank 0's newest record into the state directory's
        ``summary``, when it changed: ``hpctrain status``'s live line, the one file this
        channel writes to shared storage."""
        if self.slurm.monotonic() < self._next_summary:
            return
        self._next_summary = self.slurm.monotonic() + SUMMARY_S
        record = self.records().get(0)
        if not record:
            return
        shown = {k: v for k, v in record.items() if k != "beat_at"}
        text = repr(sorted(shown.items()))
        if text != self._summary:
            try:
                self.state.write(p.SUMMARY, shown)
                self._summary = text
            except (OSError, ValueError):
                pass      # status then shows the previous line; training goes on

    def finish(self) -> Finish:
        """What the ranks said as they left (the decision's row 6). A rank's last word
        travels by UDP beside its exit: while one is still "exiting", wait a moment for
        its "exited" (FINISH_WAIT_S) rather than judge without it."""
        end = self.slurm.monotonic() + FINISH_WAIT_S
        records = self.records()
        while any(r.get("phase") == "exiting" for r in records.values()) and \
                self.slurm.monotonic() < end:
            self.slurm.sleep(0.05)
            records = self.records()
        return Finish.from_records(records, self.world)

    def _log_sizes(self) -> tuple[int, ...]:
        sizes = []
        for log in self.logs:
            try:
                sizes.append(Path(log).stat().st_size)
            except OSError:
                sizes.append(-1)
        return tuple(sizes)

    def look(self) -> Hang | None:
        """At most every LOOK_S: a hang, or None."""
        if not self.limits.any or self.slurm.monotonic() < self._next:
            return None
        self._next = self.slurm.monotonic() + LOOK_S
        now = self.slurm.time()
        sizes = self._log_sizes()
        if sizes != self._sizes:
            self._sizes, self.output_at = sizes, now
        progress = self.progress()
        training = [r.boundaries for r in progress.values() if r.phase == "training"]
        if len(training) == self.world:
            self.clock.add(now, min(training))
        else:
            self.clock.skip()
        return assess(progress, self.world, self.started_at, now,
                      self.limits.timed(self.clock.step_s(), self.clock.longest_s),
                      self.output_at)

    def waited_for(self, failed: dict[int, dict[str, str]]) -> Hang | None:
        """The failed ranks of this attempt all gave up waiting in a collective: the hang
        of the ranks they waited for, said in the job log with those ranks' stacks. None
        when a rank failed on its own (a crash)."""
        words = {rec.get("failed", "") for rec in failed.values()}
        if words <= {"peer"}:
            # only ranks whose peer left: that peer's own word (a crash, or a timeout in a
            # collective) decides, and it may still be on its way (a node's relay sends
            # within half a second)
            self.settle(len(failed))
            words = {rec.get("failed", "") for rec in self.failed_now().values()}
        if not waited(words):
            return None
        # the others' timeouts run out within moments of the first: let them, so that
        # only the ranks nobody else waits with are named
        self.settle(len(failed))
        hang = waited_for(self.records(), self.world, self.slurm.time(), self.limits.beat_s,
                          self.limits.collective_s)
        if hang is None:
            return None
        say(f"HANG: {hang.text()}")
        if hang.ranks:
            stacks = self.collect_stacks(list(hang.ranks), max(3 * self.limits.beat_s, 5.0))
            print_stacks(stacks, self.world, hang.ranks, only_first=True)
            # its Python does not answer (SIGSTOP, stuck holding the GIL): it cannot leave
            # the attempt in its process, even before its heartbeat looks stale
            progress = self.progress()
            mute = tuple(progress[r].node for r in hang.ranks
                         if r not in stacks and r in progress and progress[r].node)
            if mute:
                hang = replace(hang, frozen_nodes=tuple(dict.fromkeys(
                    (*hang.frozen_nodes, *mute))))
        return hang

    def failed_now(self) -> dict[int, dict[str, str]]:
        """This attempt's failed ranks (waiting for the word), by rank, as of now."""
        return {r: rec for r, rec in self.records().items() if rec.get("phase") == "restarting"}

    def settle(self, seen: int) -> None:
        """Wait until no other rank has failed for SETTLE_S (at most MAX_SETTLE_S, or until
        every rank has): failures of one attempt come within moments of each other."""
        settled = self.slurm.monotonic() + SETTLE_S
        end = self.slurm.monotonic() + MAX_SETTLE_S
        while self.slurm.monotonic() < min(settled, end) and seen < self.world:
            self.slurm.sleep(FAILED_LOOK_S / 2)
            now_failed = len(self.failed_now())
            if now_failed > seen:
                settled, seen = self.slurm.monotonic() + SETTLE_S, now_failed

    def gave_up(self) -> Hang | None:
        """The step ended failed because a rank gave up waiting in a collective (without
        in-process restarts): the hang of the ranks it waited for, said in the job log.
        None for any other end."""
        hang = gave_up(self.state.read(p.EXIT, self.restart_count), self.records(),
                       self.world, self.slurm.time(), self.limits.beat_s,
                       self.limits.collective_s)
        if hang is not None:
            say(f"HANG: {hang.text()}")
        return hang

    # ---- a hang: stacks, names, kill --------------------------------------------------
    def collect_stacks(self, ranks: list[int], wait_s: float) -> dict[int, str]:
        """Ask ranks for their stacks (the runtime's progress thread answers) and wait up
        to ``wait_s`` for the answers: {rank: stacks}."""
        seq = f"{self.slurm.time():.3f}"
        self.board.request(p.DUMP, {"run_id": self.state.run_id,
                                    "restart_count": self.restart_count,
                                    "attempt": self.attempt, "seq": seq})
        end = self.slurm.monotonic() + wait_s
        answers: dict[int, str] = {}
        while self.slurm.monotonic() < end and len(answers) < len(ranks):
            for rank in ranks:
                if rank in answers:
                    continue
                try:
                    text = p.rank_file(self.state.path, p.STACKS, rank).read_text(
                        errors="replace")
                except OSError:
                    continue
                head, _, body = text.partition("\n")
                if head == f"seq={seq}":
                    answers[rank] = body
            self.slurm.sleep(0.2)
        return answers

    def name_culprits(self, hang: Hang, key: str) -> Hang:
        """Say the hang in the job log, dump the stacks there and name the rank(s) that
        stopped first; the hang as finally understood. A hung exit (every rank's work
        over) is only said: its ranks' reporters are gone, nobody is left to name."""
        say(f"HANG: {hang.text()}")
        if hang.phase == "exited":
            return hang
        progress = self.progress()
        if progress:
            # only ranks that reported can answer (the progress thread does)
            stacks = self.collect_stacks(sorted(progress), max(3 * self.limits.beat_s, 5.0))
            ranks, why = culprits(stacks, self.world, known=set(progress))
            print_stacks(stacks, self.world, ranks or hang.ranks)   # theirs whole, first
            if ranks:
                mute = [r for r in ranks if r not in stacks]
                frozen = tuple(progress[r].node for r in mute if progress[r].node)
                hang = replace(hang, ranks=ranks, why=why,
                               nodes=tuple(dict.fromkeys(progress[r].node for r in ranks
                                                         if progress[r].node)),
                               frozen_nodes=tuple(dict.fromkeys((*hang.frozen_nodes, *frozen))))
        else:
            stacks = spy_stacks(self.slurm, key, self.nodes)
            if stacks:
                ranks, why = culprits(stacks, self.world, known=set(stacks))
                print_stacks(stacks, self.world, ranks)
                nodes = tuple(dict.fromkeys(n for r in ranks if (n := node_of(stacks[r]))))
                hang = replace(hang, ranks=ranks, why=why, nodes=nodes) if ranks else hang
        if hang.ranks:
            where = f" on {','.join(hang.nodes)}" if hang.nodes else ""
            say(f"HANG: stopped first: rank(s) {ranks_text(hang.ranks)}{where} "
                f"({hang.why})")
        return hang


# Run on every node beside the hung step: each Python process of the step (found by its
# environment, so only this node's), dumped by py-spy. Constant text: the values come as
# arguments ($1 py-spy, $2 the step id), never spliced in.
SPY_SCRIPT = r"""
spy=$1 step=$2
for d in /proc/[0-9]*; do
  env=$( { tr '\0' '\n' < "$d/environ"; } 2>/dev/null ) || continue
  grep -qx "SLURM_JOB_ID=$SLURM_JOB_ID" <<< "$env" || continue
  grep -qx "SLURM_STEP_ID=$step" <<< "$env" || continue
  grep -qx "SLURMD_NODENAME=$SLURMD_NODENAME" <<< "$env" || continue
  case $(basename "$(readlink "$d/exe")") in python*) ;; *) continue ;; esac
  rank=$(grep -m1 '^RANK=' <<< "$env" | cut -d= -f2)
  echo "==== ${rank:-launcher} ${SLURMD_NODENAME} ${d#/proc/}"
  "$spy" dump --pid "${d#/proc/}" 2>&1
done
"""


def find_py_spy() -> str | None:
    """py-spy beside this Python (the job's environment), else on PATH."""
    here = os.path.dirname(sys.executable)
    return shutil.which("py-spy", path=os.pathsep.join([here, os.environ.get("PATH", "")]))


def spy_stacks(slurm: Scheduler, key: str, nodes: int) -> dict[int, str]:
    """The stacks of a step that does not report progress: py-spy on every node, when
    it is installed; {rank: stacks in the runtime's format}."""
    spy = find_py_spy()
    if spy is None:
        say("no stacks: the step does not report through hpctrain.runtime and py-spy is "
            "not installed")
        return {}
    try:
        steps = slurm.step_ids(key)
        if not steps:
            return {}
        out = slurm.run_on_nodes(["bash", "-c", SPY_SCRIPT, "hpctrain-spy", spy,
                                  steps[0].rsplit(".", 1)[1]], nodes, 60.0)
    except SlurmError as exc:
        say(f"no stacks: py-spy could not be run beside the step: {exc}")
        return {}
    stacks = parse_spy(out)
    if not stacks:
        say("no stacks: py-spy found no Python process of the step")
    return stacks


def parse_spy(text: str) -> dict[int, str]:
    """py-spy dumps, each after a ``==== RANK NODE PID`` line, as {rank: stacks} in the
    runtime's format (``--- main thread ---`` blocks); launchers, with no rank, are left out."""
    found: dict[int, str] = {}
    for block in text.split("==== ")[1:]:
        head, _, body = block.partition("\n")
        words = head.split()
        if len(words) < 3 or not words[0].isdigit():
            continue
        rank, node, pid = int(words[0]), words[1], words[2]
        threads = []
        for line in body.splitlines():
            if line.startswith("Thread "):   # Thread 42 (idle): "MainThread"
                name = line.rsplit(":", 1)[-1].strip().strip('"')
                threads.append("--- main thread ---" if name == "MainThread"
                               else f"--- thread {name} ---")
            elif line.startswith("    ") and threads:   # a frame: "    main (t.py:3)"
                threads.append(line)
        found[rank] = f"rank {rank} on {node} (pid {pid}), by py-spy\n" + "\n".join(threads)
    return found


def print_stacks(stacks: dict[int, str], world: int, first: tuple[int, ...],
                 only_first: bool = False) -> None:
    """Every rank's stacks (``only_first``: the named ranks', the only ones asked) into
    the job log: the named ranks first and whole (up to FULL_STACKS), the rest grouped by
    their innermost frame, one line per frame (8,192 ranks waiting in one all-reduce are
    one line); and who did not answer."""
    order = [*first, *(r for r in range(world) if r not in first and not only_first)]
    shown, mute, at = 0, [], {}
    for rank in order:
        if rank not in stacks:
            mute.append(rank)
        elif shown < FULL_STACKS:
            lines = stacks[rank].splitlines()
            text = "\n".join(lines[:STACK_LINES]) + ("\n  ..." if len(lines) > STACK_LINES
                                                     else "")
            print(f"hpctrain: ---- stacks of {text}", file=sys.stderr, flush=True)
            shown += 1
        else:
            at.setdefault(innermost(stacks[rank]) or "?", []).append(rank)
    for where, ranks in at.items():
        say(f"rank {ranks_text(tuple(ranks))}: at {where}")
    if mute:
        say(f"rank {ranks_text(tuple(mute))}: no stacks (did not answer: frozen holding the "
            "GIL, stopped, or the node is gone)")


def kill(slurm: Scheduler, step: StepProcess, key: str) -> int:
    """SIGKILL the step's processes on every node (Slurm), else the local launcher; wait
    for it to end. Its exit status."""
    try:
        killed = slurm.kill_steps(key)
        say(f"killing the hung step ({', '.join(killed) or 'no step found'}): SIGKILL on "
            "every node")
        if not killed:
            step.kill_local("KILL")
    except SlurmError as exc:
        say(f"could not kill the step through Slurm ({exc}): killing the local launcher")
        step.kill_local("KILL")
    end = slurm.monotonic() + KILL_WAIT_S
    while (status := step.poll()) is None:
        if slurm.monotonic() > end:
            step.kill_local("KILL")
            end = slurm.monotonic() + KILL_WAIT_S
        slurm.sleep(0.2)
    return status
