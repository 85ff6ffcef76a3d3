"""The supervisor's response to a hang the watchdog found in one attempt
(:class:`hpctrain.supervisor.hang.Watch`, the view): collect every rank's Python stacks into
the job log (from the ranks' progress threads, else py-spy beside the step), name the
rank(s) that stopped first, and kill the step when it must be restarted in new processes.
Its waits take the stop signals that arrive meanwhile (``pump``): a preemption's grace
time does not wait for a stack dump.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import replace

from hpctrain import protocol as p
from hpctrain.errors import SlurmError
from hpctrain.protocol.dialog import Attempt, StackRequest
from hpctrain.supervisor.board import Board
from hpctrain.protocol.progress import Progress
from hpctrain.supervisor.hang import FAILED_LOOK_S, Watch
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.scheduler import Scheduler, StepProcess
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.waits import Waiter
from hpctrain.supervisor.watchdog import (Hang, culprits, innermost, node_of, ranks_text,
                                          waited, waited_for)

KILL_WAIT_S = 60.0      # how long a killed step may take to end
SETTLE_S, MAX_SETTLE_S = 1.0, 5.0   # ranks timing out in a collective: wait for the rest
STACKS_POLL_S = 0.2     # how often the ranks' answered stacks are looked for
STACK_LINES = 60        # lines of one rank's stacks printed into the job log
FULL_STACKS = 8         # ranks whose stacks are printed whole (the others: a line per frame)


class HangResponse:
    """Stacks and culprits of a hung attempt, for the job log."""

    def __init__(self, slurm: Scheduler, state: StateDir, board: Board,
                 pump: Callable[[], None] = lambda: None) -> None:
        self.slurm, self.state, self.board = slurm, state, board
        self.waiter = Waiter(slurm, pump)    # stop signals taken while it waits

    def hang_behind(self, watch: Watch, failed: dict[int, Progress]) -> Hang | None:
        """The failed ranks of ``watch``'s attempt all gave up waiting in a collective: the
        hang of the ranks they waited for, said in the job log with those ranks' stacks
        (:meth:`name_waited_for`). None when a rank failed on its own (a crash)."""
        words = {rec.failed for rec in failed.values()}
        if words <= {"peer"}:
            # only ranks whose peer left: that peer's own word (a crash, or a timeout in a
            # collective) decides, and it may still be on its way (a node's relay sends
            # within half a second)
            self.settle(watch, len(failed))
            words = {rec.failed for rec in watch.failed_now().values()}
        if not waited(words):
            return None
        # the others' timeouts run out within moments of the first: let them, so that
        # only the ranks nobody else waits with are named
        self.settle(watch, len(failed))
        hang = waited_for(watch.records(), watch.world, self.slurm.time(),
                          watch.limits.beat_s, watch.limits.collective_s)
        return None if hang is None else self.name_waited_for(watch, hang)

    def settle(self, watch: Watch, seen: int) -> None:
        """Wait until no other rank has failed for SETTLE_S (at most MAX_SETTLE_S, or until
        every rank has): failures of one attempt come within moments of each other."""
        settled = self.slurm.monotonic() + SETTLE_S

        def settled_down() -> bool:
            nonlocal seen, settled
            now_failed = len(watch.failed_now())
            if now_failed > seen:
                settled, seen = self.slurm.monotonic() + SETTLE_S, now_failed
            return seen >= watch.world or self.slurm.monotonic() >= settled

        self.waiter.until(settled_down, MAX_SETTLE_S, FAILED_LOOK_S / 2)

    def collect_stacks(self, watch: Watch, ranks: list[int], wait_s: float) -> dict[int, str]:
        """Ask the ranks of ``watch``'s attempt for their stacks (the runtime's progress
        thread answers) and wait up to ``wait_s`` for the answers (stop signals are taken
        meanwhile): {rank: stacks}."""
        seq = f"{self.slurm.time():.3f}"
        self.board.ask(StackRequest(Attempt(self.state.run_id or "", watch.restart_count,
                                            watch.attempt), seq))
        answers: dict[int, str] = {}

        def answered() -> bool:
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
            return len(answers) >= len(ranks)

        self.waiter.until(answered, wait_s, STACKS_POLL_S)
        return answers

    def name_waited_for(self, watch: Watch, hang: Hang) -> Hang:
        """A hang found from ranks that gave up waiting in a collective
        (:meth:`hang_behind`): said in the job log with the stacks of the ranks they
        waited for; one whose Python does not answer (SIGSTOP, stuck holding the GIL) cannot
        leave the attempt in its process, even before its heartbeat looks stale: its node
        is named frozen."""
        say(f"HANG: {hang.text()}")
        if not hang.ranks:
            return hang
        stacks = self.collect_stacks(watch, list(hang.ranks),
                                     max(3 * watch.limits.beat_s, 5.0))
        print_stacks(stacks, watch.world, hang.ranks, only_first=True)
        progress = watch.records()
        mute = tuple(progress[r].node for r in hang.ranks
                     if r not in stacks and r in progress and progress[r].node)
        if mute:
            hang = replace(hang, frozen_nodes=tuple(dict.fromkeys((*hang.frozen_nodes, *mute))))
        return hang

    def name_culprits(self, watch: Watch, hang: Hang, key: str) -> Hang:
        """Say the hang in the job log, dump the stacks there and name the rank(s) that
        stopped first; the hang as finally understood. A hung exit (every rank's work
        over) is only said: its ranks' reporters are gone, nobody is left to name."""
        say(f"HANG: {hang.text()}")
        if hang.phase == "exited":
            return hang
        # only ranks that reported can answer (the progress thread does), and only through
        # the channel: while it is silent, py-spy reads the stacks as for a plain script
        progress = {} if watch.channel_silent else watch.records()
        if progress:
            stacks = self.collect_stacks(watch, sorted(progress),
                                         max(3 * watch.limits.beat_s, 5.0))
            ranks, why = culprits(stacks, watch.world, known=set(progress))
            print_stacks(stacks, watch.world, ranks or hang.ranks)   # theirs whole, first
            if ranks:
                mute = [r for r in ranks if r not in stacks]
                frozen = tuple(progress[r].node for r in mute if progress[r].node)
                hang = replace(hang, ranks=ranks, why=why,
                               nodes=tuple(dict.fromkeys(progress[r].node for r in ranks
                                                         if progress[r].node)),
                               frozen_nodes=tuple(dict.fromkeys((*hang.frozen_nodes, *frozen))))
        else:
            stacks = spy_stacks(self.slurm, key, watch.nodes)
            if stacks:
                ranks, why = culprits(stacks, watch.world, known=set(stacks))
                print_stacks(stacks, watch.world, ranks)
                nodes = tuple(dict.fromkeys(n for r in ranks if (n := node_of(stacks[r]))))
                hang = replace(hang, ranks=ranks, why=why, nodes=nodes) if ranks else hang
        if hang.ranks:
            where = f" on {','.join(hang.nodes)}" if hang.nodes else ""
            say(f"HANG: stopped first: rank(s) {ranks_text(hang.ranks)}{where} "
                f"({hang.why})")
        return hang


# Run on every node beside the hung step: each Python process of the step (found by its
# environment, so only this node's), dumped by py-spy. Constant text: the values come as
# arguments ($1 py-spy, $2 the step id), never spliced in. Every line of a dump carries its
# process's tag ("RANK NODE PID|"): srun interleaves the nodes' output line by line, so a
# dump's lines are told apart by their tag, not by where they fall.
SPY_SCRIPT = r"""
spy=$1 step=$2
for d in /proc/[0-9]*; do
  env=$( { tr '\0' '\n' < "$d/environ"; } 2>/dev/null ) || continue
  grep -qx "SLURM_JOB_ID=$SLURM_JOB_ID" <<< "$env" || continue
  grep -qx "SLURM_STEP_ID=$step" <<< "$env" || continue
  grep -qx "SLURMD_NODENAME=$SLURMD_NODENAME" <<< "$env" || continue
  case $(basename "$(readlink "$d/exe")") in python*) ;; *) continue ;; esac
  rank=$(grep -m1 '^RANK=' <<< "$env" | cut -d= -f2)
  tag="${rank:-launcher} ${SLURMD_NODENAME} ${d#/proc/}"
  printf '%s|\n' "$tag"
  "$spy" dump --pid "${d#/proc/}" 2>&1 | while IFS= read -r line; do
    printf '%s|%s\n' "$tag" "$line"
  done
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


_SPY_LINE = re.compile(r"^(\d+) (\S+) (\d+)\|(.*)$")


def parse_spy(text: str) -> dict[int, str]:
    """py-spy dumps, each line tagged ``RANK NODE PID|`` (in any order between processes),
    as {rank: stacks} in the runtime's format (``--- main thread ---`` blocks); launchers,
    with no rank, and untagged lines (srun's own) are left out."""
    heads: dict[int, str] = {}
    threads: dict[int, list[str]] = {}
    for raw in text.splitlines():
        m = _SPY_LINE.match(raw)
        if not m:
            continue
        rank, line = int(m.group(1)), m.group(4)
        heads.setdefault(rank, f"rank {rank} on {m.group(2)} (pid {m.group(3)}), by py-spy")
        mine = threads.setdefault(rank, [])
        if line.startswith("Thread "):   # Thread 42 (idle): "MainThread"
            name = line.rsplit(":", 1)[-1].strip().strip('"')
            mine.append("--- main thread ---" if name == "MainThread"
                        else f"--- thread {name} ---")
        elif line.startswith("    ") and mine:   # a frame: "    main (t.py:3)"
            mine.append(line)
    return {rank: "\n".join([head, *threads[rank]]) for rank, head in heads.items()}


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
