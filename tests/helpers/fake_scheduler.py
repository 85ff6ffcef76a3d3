"""A recorded-behaviour stand-in of Slurm, of a training step and of the clock, for driving
:class:`hpctrain.supervisor.run.Supervisor` through a whole job in a unit test.

What it plays back is what the devcluster showed (Slurm 22.05; docs/fault-recovery.md, "What
Slurm does, as seen on the devcluster", and tests/cluster/test_supervisor_cluster.py,
test_requeue_limits_cluster.py, test_watchdog_cluster.py, test_recovery_cluster.py, which
keep proving it):

- preemption: ``PreemptTime`` set and SIGTERM to the steps at once; ``GRACE_S`` later Slurm
  requeues the job itself (``Restarts`` + 1) unless the batch step did first;
- the time-limit warning: the requeue signal to the batch step only;
- the time limit: SIGTERM to steps and batch step, ``COMPLETING``, ``Reason=TimeLimit``;
- scancel: SIGTERM to steps and batch step, ``COMPLETING``;
- node loss: the ranks there die at once, the others fail in their collective, and srun
  waits for the tasks it cannot hear from; ``DETECT_S`` later Slurm marks the node
  ``DOWN*``, the step ends, and Slurm requeues the job;
- the loss of one node of several (``lose:n2``, [elastic] spare nodes): the ranks there
  stop their heartbeat, the others wait in their collective (still beating), srun waits;
  ``DETECT_S`` later Slurm marks the node ``DOWN*`` and ends the run NODE_FAIL unless the
  node was taken from the job (``shrink_job``) first: then only the step on it ends;
  ``lose-peers:n2``: the same, but under hpctrain.runtime.run the others' collectives fail
  of their lost peers a second later and they wait for the word; told to stop they leave,
  and srun goes on waiting for the lost node's tasks;
- a node whose processes die first (``die:n2``: a GPU fallen off the bus, then the node
  dark): srun hears "task N: Killed" from its stepd and ends the step at once (137); the
  others fail of their lost peers; the node answers no step (``probe_nodes``: srun's
  "Communication connection failure" after MessageTimeout) and Slurm marks it ``DOWN*``
  ``DETECT_S`` later; ``kill:n2``: the same deaths on a node that stays up (it answers);
- a controller that does not answer (``outage``): every call fails "Unable to contact slurm
  controller" for a while.

And how each kind of script answers a stop signal (:class:`Kind`): the runtime's loop saves
at its next step boundary and exits with its cause's code (75/76; under torchrun 1 and an
exit record); a plain torchrun script's agent dies of TERM with status 1 (one node); a
plain bash step under srun dies of the signal (128+N). The clock is the stand-in's own:
a sleep advances it at once, so a 60 s job takes milliseconds.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from hpctrain import protocol as p
from hpctrain.protocol.preflight import NodeSpeed
from hpctrain.errors import SlurmError
from hpctrain.protocol import channel
from hpctrain.runtime.relay import Relay
from hpctrain.slurm.view import JobView

T0 = 1_800_000_000.0   # the stand-in's wall clock at its start
GRACE_S = 10.0         # the devcluster's GraceTime
DETECT_S = 26.0        # SlurmdTimeout: a lost node is noticed this much later
MESSAGE_S = 11.0       # a step launched on a node whose slurmd is dead fails this much later
PEER_LOST = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
             "closed by peer [127.0.0.1]:23471")
SAVE_S = 1.0           # the runtime's emergency save


@dataclass(frozen=True)
class Kind:
    """A kind of training script: how it reports, saves, and dies."""

    name: str                  # runtime | torchrun | srun
    launcher: str              # what the spec's launcher is
    progress: bool             # writes the runtime's progress records
    stop_code: Callable[[str, str], int]  # (signal, cause) -> the step's status on a stop
    crash_code: int            # the step's status when a rank raises
    crash_line: str            # what the launcher printed of it (srun's view)
    inprocess: bool = False    # under hpctrain.runtime.run: a failed attempt waits


def _runtime_code(sig: str, cause: str) -> int:
    return 75 if cause == "preemption" else 76


KINDS = {
    "runtime": Kind("runtime", "srun", True, _runtime_code, 1,
                    "srun: error: n1: task 1: Exited with exit code 1"),
    "torchrun": Kind("torchrun", "torchrun", False, lambda sig, cause: 1, 1,
                     "srun: error: n1: task 0: Exited with exit code 1"),
    "srun": Kind("srun", "srun", False,
                 lambda sig, cause: 128 + signal.Signals["SIG" + sig], 3,
                 "srun: error: n1: task 1: Exited with exit code 3"),
    # hpctrain.runtime.run: a failed attempt (a raise, or the supervisor's interrupt of a
    # hang) says so and waits for the supervisor's word, as tests/unit/test_runtime_restart
    # shows the runtime doing
    "inprocess": Kind("inprocess", "srun", True, _runtime_code, 1,
                      "srun: error: n1: task 1: Exited with exit code 1", inprocess=True),
}


@dataclass
class FakeStep:
    """One start of the training step: ``steps`` steps of ``step_s`` seconds; ``crash_at``
    and ``hang_at`` (a step number) make it fail or stop progressing there."""

    fake: FakeSlurm
    kind: Kind
    env: Mapping[str, str]
    steps: int = 10
    step_s: float = 1.0
    crash_at: int = -1
    hang_at: int = -1
    started: float = 0.0
    status: int | None = None
    stop: tuple[str, float] | None = None      # the first stop signal and when it came
    done_steps: int = 0
    lost: bool = False                         # its node died: srun waits, nothing moves
    stuck: int = -1                            # this rank never leaves a failed attempt
    attempt: int = -1                          # in-process attempts: the current one
    waiting: str = ""                          # ...failed (crash, hang): waits for the word
    hung_rank: int = -1                        # at hang_at only this rank stops; the others
    collective_s: float = 5.0                  # ...give up waiting for it after this long
    timed_out: bool = False                    # ...and did (their word: timeout)
    waited: bool = False                       # crash_at is a rank giving up in a collective
    frozen: int = -1                           # this rank answers no stack request
    device_error: bool = False                 # crash_at is a device error (CUDA): the
    #                                            rank says its process cannot go on
    every: bool = False                        # the faults strike every attempt (a bug)
    peers_fail_at: float | None = None         # [lose-peers] the survivors' collectives
    #                                            fail of the lost peers then (runtime.run)
    left: bool = False                         # ...and they left, told to stop: srun still
    #                                            waits for the lost node's tasks
    nodes: Sequence[str] = ("n1",)             # where its ranks run (srun --nodelist)
    lost_on: set[str] = field(default_factory=set)   # its nodes lost: their ranks are silent
    first: int = field(init=False, default=0)  # the attempt the faults are planned for
    relays: dict[str, Relay] = field(default_factory=dict)   # each node's, the product's own

    def __post_init__(self) -> None:
        self.attempt = self.first = int(self.env[p.STEP_ATTEMPT])
        # a step the supervisor shrank says its world in its environment
        self.world = int(self.env[p.WORLD_SIZE]) if p.FULL_DP in self.env else self.fake.world

    def node_of(self, rank: int) -> str:
        return self.nodes[rank * len(self.nodes) // self.world]

    def relay(self, node: str) -> Relay:
        """Node ``node``'s relay (the runtime's, sending every tick: the stand-in's beats
        are its progress writes) to the supervisor's progress board, over real UDP."""
        if node not in self.relays:
            env = {**self.env, channel.LOCAL_DIR: str(self.fake.log_path.parent / "shm")}
            local = channel.node_dir(env, self.env[p.RUN_ID], int(self.env[p.RESTART_COUNT]),
                                     node)
            addr = channel.address({**env, channel.HOST: "127.0.0.1"})
            assert addr is not None, "the supervisor gave the step no progress channel"
            self.relays[node] = Relay(local, addr, self.env[channel.TOKEN], node, beat_s=0.0)
        return self.relays[node]

    def relay_all(self) -> None:
        """Each live node's relay: its records out, the supervisor's requests in."""
        for node in dict.fromkeys(self.nodes):
            if node not in self.lost_on and not self.lost:
                self.relay(node).tick()

    def signal(self, sig: str) -> None:
        """A signal to every rank (Slurm's, or the supervisor's scancel --signal)."""
        if self.status is None and self.stop is None and sig != "KILL":
            self.stop = (sig, self.fake.now)
        if sig == "KILL" and self.status is None:
            self.status = 137

    def advance(self) -> None:
        """Play the step forward to the stand-in's clock."""
        if self.status is not None or self.lost or self.left:
            return
        if self.waiting:
            return self.wait_for_the_word()
        if self.lost_on and self.peers_fail_at is not None and \
                self.fake.now >= self.peers_fail_at:
            self.waiting = "peer"          # their attempt failed: they wait for the word
            return self.write_progress()
        if self.lost_on:   # the others wait for the lost ranks in a collective, beating
            return self.write_progress()
        elapsed = self.fake.now - self.started
        self.done_steps = min(self.steps, int(elapsed / self.step_s))
        faulty = self.attempt == self.first or self.every
        if faulty and 0 <= self.hang_at <= self.done_steps:
            self.done_steps = self.hang_at   # alive (heartbeats), no step boundary any more
            if self.kind.inprocess and self.asked(p.INTERRUPT):
                return self.fail("hang")
            if self.kind.inprocess and self.hung_rank >= 0 and \
                    elapsed > (self.hang_at + 1) * self.step_s + self.collective_s:
                self.timed_out = True   # the others' collective timeout ran out
            self.write_progress()
            return
        if faulty and 0 <= self.crash_at <= self.done_steps:
            if self.kind.inprocess:
                self.fake.log(self.kind.crash_line.replace("srun: error", "(in-process)"))
                self.write_crash()
                return self.fail("crash")
            return self.crash()
        if self.stop is not None:
            return self.on_stop(*self.stop)
        self.write_progress()
        if self.done_steps >= self.steps:
            self.status = 0

    def crash(self) -> None:
        self.fake.log(self.kind.crash_line)
        if self.kind.progress:
            self.write_crash()
        self.status = self.kind.crash_code

    def write_crash(self) -> None:
        waited = {"waited": 1, "error": "RuntimeError: Timed out waiting 5000ms for recv "
                  "operation to complete"} if self.waited else {}
        p.write_record(self.env[p.EXIT_FILE], {
            "cause": "user_crash", "exit_code": 1, "requeue": 0, "step": self.crash_at,
            "restart_count": self.env[p.RESTART_COUNT], "rank": 1, "node": "n1",
            "run_id": self.env[p.RUN_ID], "error": "RuntimeError: simulated crash", **waited})

    def killed_on(self, node: str) -> None:
        """Every process of the step on ``node`` killed: its stepd tells srun, which ends
        the step; the ranks elsewhere fail of their lost peers and say so."""
        tasks = [r for r in range(self.world) if self.node_of(r) == node] \
            if self.kind.launcher == "srun" else [list(self.nodes).index(node)]
        self.fake.log(f"srun: error: {node}: task {tasks[0]}: Killed")
        if self.kind.progress:
            survivors = [r for r in range(self.world) if self.node_of(r) != node]
            self.write_final(survivors, "restarting" if self.kind.inprocess else "exited")
            p.write_record(self.env[p.EXIT_FILE], {
                "cause": "user_crash", "exit_code": 1, "requeue": 0, "step": self.done_steps,
                "restart_count": self.env[p.RESTART_COUNT], "rank": survivors[0],
                "node": self.node_of(survivors[0]), "run_id": self.env[p.RUN_ID],
                "error": PEER_LOST})
        self.fake.log("srun: error: n1: task 0: Exited with exit code 1")
        self.status = 137

    def write_final(self, ranks: list[int], phase: str) -> None:
        """The last word of ``ranks``: their attempt failed of a lost peer."""
        for rank in ranks:
            word = {"failed": "peer", "error": PEER_LOST}
            if phase == "exited":
                word.update(exit="crash", flushed="1")
            local = self.relay(self.node_of(rank)).local
            p.write_record(p.rank_file(local, p.PROGRESS, rank), {
                "run_id": self.env[p.RUN_ID], "restart_count": self.env[p.RESTART_COUNT],
                "attempt": self.attempt, "rank": rank, "node": self.node_of(rank),
                "step": self.done_steps, "boundaries": self.done_steps, "phase": phase,
                "changed_at": f"{self.fake.wall(self.fake.now):.3f}",
                "beat_at": f"{self.fake.wall(self.fake.now):.3f}", **word})
        self.relay_all()

    # ---- hpctrain.runtime.run ------------------------------------------------------------
    def asked(self, name: str) -> dict[str, str]:
        """The supervisor's record ``name`` when it is for this attempt's successor (resume)
        or this attempt (interrupt), else {}."""
        want = self.attempt + 1 if name == p.RESUME else self.attempt
        self.relay_all()
        record = p.read_record(self.relay(self.nodes[0]).local / name)
        return record if record.get("attempt") == str(want) and \
            record.get("run_id") == self.env[p.RUN_ID] else {}

    def fail(self, word: str) -> None:
        self.waiting = word
        self.write_progress()

    def wait_for_the_word(self) -> None:
        word = self.asked(p.RESUME).get("action")
        if word == "go":
            self.attempt, self.waiting, self.started = self.attempt + 1, "", self.fake.now
            self.timed_out = False
            self.done_steps = 0
            self.write_progress()
        elif word == "stop" and self.lost_on:
            # they leave; srun waits for the lost node's tasks until Slurm marks it down
            self.write_final([r for r in range(self.world)
                              if self.node_of(r) not in self.lost_on], "exited")
            self.left = True
        elif word == "stop":
            self.status = self.kind.crash_code if self.waiting == "crash" else 1

    def on_stop(self, sig: str, at: float) -> None:
        if not self.kind.progress:       # a plain script dies of the signal
            self.status = self.kind.stop_code(sig, "")
            return
        if self.fake.now < at + self.step_s + SAVE_S:   # the next boundary, then the save
            return
        notice = p.read_record(self.env[p.STOP_FILE])
        cause = notice.get("cause") or ("time_limit" if sig != "TERM" else "preemption")
        p.write_record(self.env[p.EXIT_FILE], {
            "cause": cause, "exit_code": _runtime_code(sig, cause), "requeue": 1,
            "step": self.done_steps, "restart_count": self.env[p.RESTART_COUNT],
            "run_id": self.env[p.RUN_ID]})
        self.status = self.kind.stop_code(sig, cause)

    def answer_stacks(self) -> None:
        """Each live rank's progress thread answers a stack request of its attempt (a
        frozen one, ``frozen``, does not)."""
        request = self.asked(p.DUMP)
        for rank in range(self.world) if request else ():
            if rank != self.frozen:
                path = p.rank_file(self.env[p.STATE_DIR], p.STACKS, rank)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(
                    f"seq={request['seq']}\nrank {rank} on n1\n--- main thread ---\n"
                    '  File "train.py", line 1, in step\n')

    def write_progress(self) -> None:
        if not self.kind.progress:
            return
        self.answer_stacks()
        changed = self.started + self.done_steps * self.step_s
        for rank in range(self.world):
            if self.node_of(rank) in self.lost_on:
                continue                                # gone with its node: no heartbeat
            waiting = self.waiting and rank != self.stuck   # stuck: still "training"
            gave_up = self.timed_out and rank != self.hung_rank
            phase = "restarting" if waiting or gave_up else \
                "training" if self.done_steps else "startup"
            able = self.kind.inprocess and not (self.device_error and self.waiting == "crash"
                                                and rank == 1)
            extra = {"inprocess": 1} if able else {}
            if self.kind.inprocess:     # runtime.run says so, whether it can or not
                extra["wrapped"] = 1
            if gave_up:
                extra.update(failed="timeout", error="RuntimeError: Timed out waiting "
                             f"{self.collective_s * 1000:.0f}ms for recv operation to complete")
            elif waiting:
                extra.update(failed=self.waiting, error=PEER_LOST if self.waiting == "peer"
                             else "RuntimeError: simulated crash")
            if self.done_steps >= 3:   # its own time per step (hpctrain.runtime.pace): a
                # slow node's ranks work the whole step, the others half and wait for them
                share = 1.0 if self.node_of(rank) in self.fake.slow else 0.5
                extra["own"] = f"{self.step_s * share:g}"
            local = self.relay(self.node_of(rank)).local
            p.write_record(p.rank_file(local, p.PROGRESS, rank), {
                "run_id": self.env[p.RUN_ID], "restart_count": self.env[p.RESTART_COUNT],
                "attempt": self.attempt, "rank": rank, "node": self.node_of(rank),
                "step": self.done_steps, "boundaries": self.done_steps, "phase": phase,
                "changed_at": f"{self.fake.wall(changed):.3f}",
                "beat_at": f"{self.fake.wall(self.fake.now):.3f}", **extra})
        self.relay_all()

    # ---- what the supervisor calls ------------------------------------------------------
    def poll(self) -> int | None:
        self.advance()
        return self.status

    def kill_local(self, signal_name: str) -> None:
        self.signal(signal_name)


@dataclass
class FakeProbe:
    """Nodes being asked for a step, on the stand-in's clock: the answers are in at
    ``done``, and waiting for them sleeps until then."""

    slurm: FakeSlurm
    nodes: tuple[str, ...]
    said: dict[str, str | None]
    done: float

    def answers(self) -> dict[str, str | None]:
        if self.slurm.now < self.done:
            self.slurm.sleep(self.done - self.slurm.now)
        return self.said


@dataclass
class FakeSlurm:
    """Slurm, the step and the clock, as one :class:`hpctrain.supervisor.scheduler.Scheduler`.

    ``events``: (seconds after the start, what) with what one of ``preempt``, ``warn``,
    ``scancel``, ``time_limit``, ``node_loss``, ``lose:NODE`` (one node of ``nodes``, the
    allocation), ``slow:NODE`` (its ranks at half speed from then on); ``steps``: how
    each start of the step goes
    (keyword arguments of :class:`FakeStep`, one dict per start; the last one repeats)."""

    kind: Kind
    log_path: Path
    events: Sequence[tuple[float, str]] = ()
    steps: Sequence[dict] = ({},)
    world: int = 2
    restart_count: int = 0
    outage: tuple[str, float] | None = None   # the first call of this kind starts an
    #                                           outage of the controller this long
    time_limit_s: float = 3600.0              # the job's EndTime, after the start
    sacct_lag_s: float = 0.0                  # slurmdbd records a requeued run's end this
    #                                           long after Slurm requeued it (until then
    #                                           sacct still calls that run RUNNING)
    now: float = 0.0
    view: JobView = field(init=False)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    started: list[FakeStep] = field(default_factory=list)
    batch: Callable[[int, object], None] | None = None   # the supervisor's signal handler
    node_state: dict[str, str] = field(default_factory=lambda: {"n1": "ALLOCATED"})
    nodes: Sequence[str] = ("n1",)      # the allocation ([elastic]: the spares included)
    dead: set[str] = field(default_factory=set)   # nodes whose slurmd is gone
    slow: set[str] = field(default_factory=set)   # nodes that run at half speed (slow:NODE)
    sick: set[str] = field(default_factory=set)   # their preflight check fails (sick:NODE)
    _due: list[tuple[float, str]] = field(default_factory=list)
    _down_until: float | None = None
    _requeued_at: list[float] = field(default_factory=list)   # Slurm's requeues, when

    def __post_init__(self) -> None:
        self.view = JobView("42", "RUNNING", "None", self.restart_count, None,
                            T0 + self.time_limit_s, True, std_err=str(self.log_path),
                            node_list=",".join(self.nodes), partition="debug",
                            num_nodes=len(self.nodes))
        self.node_state = {**{n: "ALLOCATED" for n in self.nodes}, **self.node_state}
        self._due = sorted(self.events)
        self.sleep(0.0)    # what happened before the supervisor started (its set-up)

    def wall(self, t: float) -> float:
        return T0 + t

    def log(self, line: str) -> None:
        with open(self.log_path, "a") as fh:
            fh.write(line + "\n")

    # ---- Slurm's side of each event, as the devcluster showed it ------------------------
    def _play(self, what: str) -> None:
        step = self.started[-1] if self.started else None
        if what == "preempt":
            self.view = replace(self.view, preempt_time=self.wall(self.now),
                                end_time=self.wall(self.now + GRACE_S))
            self._due.append((self.now + GRACE_S, "grace_over"))
            self._to_steps(step, "TERM")
        elif what == "grace_over" and self.view.restarts == self.restart_count:
            self._slurm_requeues()
        elif what == "warn":
            self._to_batch("USR2")
        elif what in ("scancel", "time_limit"):
            reason = "TimeLimit" if what == "time_limit" else "None"
            self.view = replace(self.view, state="COMPLETING", reason=reason)
            self._to_steps(step, "TERM")
            self._to_batch("TERM")
        elif what == "node_loss":
            if step is not None:
                step.lost = True
            self._due.append((self.now + DETECT_S, "node_down"))
        elif what == "node_down":
            self.node_state["n1"] = "DOWN*"
            if step is not None and step.status is None:
                step.status = 1          # srun gives up on the lost tasks
            self._slurm_requeues()
        elif what.startswith(("lose:", "lose-peers:")):
            verb, node = what.split(":", 1)
            for running in self.started:
                if running.status is None and node in running.nodes:
                    running.lost_on.add(node)
                    if verb == "lose-peers" and running.kind.inprocess:
                        running.peers_fail_at = self.now + 1.0
            self._due.append((self.now + DETECT_S, f"down:{node}"))
        elif what.startswith(("die:", "kill:")):
            verb, node = what.split(":", 1)
            for running in self.started:
                if running.status is None and node in running.nodes:
                    running.killed_on(node)
            if verb == "die":       # then the node goes dark
                self.dead.add(node)
                self._due.append((self.now + DETECT_S, f"down:{node}"))
        elif what.startswith("slow:"):
            self.slow.add(what.split(":", 1)[1])
        elif what.startswith("sick:"):
            self.sick.add(what.split(":", 1)[1])
        elif what.startswith("down:"):
            node = what.split(":", 1)[1]
            self.node_state[node] = "DOWN*"
            for running in self.started:   # srun: "Node failure"
                if running.status is None and node in running.lost_on:
                    running.status, running.left = 1, False
            if node in self.view.node_list.split(","):   # still the job's: NODE_FAIL
                self._slurm_requeues()
        self._due.sort()

    def _slurm_requeues(self) -> None:
        self._requeued_at.append(self.now)
        self.view = replace(self.view, restarts=self.view.restarts + 1, state="COMPLETING")
        self._to_batch("TERM")

    def _to_steps(self, step: FakeStep | None, sig: str) -> None:
        if step is not None:
            step.signal(sig)

    def _to_batch(self, sig: str) -> None:
        if self.batch is not None:
            self.batch(signal.Signals["SIG" + sig], None)

    def _check_reachable(self, what: str) -> None:
        self.calls.append((what,))
        if self.outage is not None and what == self.outage[0] and self._down_until is None:
            self._down_until = self.now + self.outage[1]
        if self._down_until is not None and self.now < self._down_until:
            raise SlurmError(f"{what}: Unable to contact slurm controller (connect failure)")

    # ---- the clock ------------------------------------------------------------------------
    def time(self) -> float:
        return self.wall(self.now)

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for step in self.started:   # the ranks' progress threads answer meanwhile
            if step.status is None and not step.lost and step.kind.progress:
                step.answer_stacks()
        while self._due and self._due[0][0] <= self.now:
            self._play(self._due.pop(0)[1])

    # ---- Slurm ------------------------------------------------------------------------------
    def show_job(self, key: str) -> JobView | None:
        self._check_reachable("show_job")
        return self.view

    def run_states(self, key: str) -> list[str]:
        self.calls.append(("run_states",))
        down = any(state.startswith("DOWN") for state in self.node_state.values())
        states = ["NODE_FAIL" if down else "PREEMPTED"
                  if self.view.preempt_time else "REQUEUED"] * self.view.restarts
        for n, at in enumerate(self._requeued_at):
            if self.now - at < self.sacct_lag_s:
                states[self.restart_count + n] = "RUNNING"
        return states

    def requeue(self, key: str) -> str:
        self._check_reachable("requeue")
        if self.view.restarts > self.restart_count:
            return "already"
        self.view = replace(self.view, restarts=self.view.restarts + 1, state="COMPLETING")
        return "requeued"

    def forbid_requeue(self, key: str) -> None:
        self.calls.append(("forbid_requeue",))

    def signal_steps(self, key: str, signal_name: str) -> None:
        """``scancel --signal``: of the job (its newest step) or of one step (``42.1``)."""
        self.calls.append(("signal_steps", signal_name))
        _, _, number = key.partition(".")
        target = self.started[int(number)] if number else \
            self.started[-1] if self.started else None
        self._to_steps(target, signal_name)

    def step_ids(self, key: str) -> list[str]:
        return [f"42.{i}" for i, step in enumerate(self.started) if step.status is None]

    def kill_steps(self, key: str) -> list[str]:
        self.calls.append(("kill_steps",))
        ids = self.step_ids(key)
        self._to_steps(self.started[-1] if self.started else None, "KILL")
        return ids

    def set_excluded(self, key: str, nodes: list[str]) -> None:
        self.calls.append(("set_excluded", ",".join(nodes)))

    def set_nodes(self, key: str, count: int) -> None:
        self.calls.append(("set_nodes", str(count)))

    def shrink_job(self, key: str, nodes: list[str]) -> None:
        self.calls.append(("shrink_job", ",".join(nodes)))
        self.view = replace(self.view, node_list=",".join(nodes), num_nodes=len(nodes))

    def node_states(self, nodes: list[str]) -> dict[str, str]:
        return {n: self.node_state.get(n, "IDLE") for n in nodes}

    def partition_nodes(self, partition: str) -> list[str]:
        return ["n1", "n2", "n3"]

    def run_on_nodes(self, argv: list[str], nodes: int, timeout: float) -> str:
        self.calls.append(("run_on_nodes", argv[0]))
        return ""

    def run_on(self, argv: list[str], nodes: list[str], timeout: float) -> str:
        self.calls.append(("run_on", " ".join(argv[1:3]), ",".join(nodes)))
        if "hpctrain.runtime.preflight" in argv:     # a slow node multiplies at a third
            self.now += 3.0
            answer = [n for n in nodes if n not in self.dead and n not in self.sick]
            # the all-reduce completes only when every node joins
            joined = (0.002, 4.0) if len(answer) == len(nodes) else (0.0, 0.0)
            return "".join(NodeSpeed(n, 3.0 if n in self.slow else 10.0, "cpu", 0, 1.0,
                                     *joined).line() + "\n" for n in answer) + \
                "".join(f"srun: error: {n}: task {nodes.index(n)}: Exited with exit code 1\n"
                        for n in nodes if n in self.sick)
        return ""

    def probe_nodes(self, nodes: list[str], timeout: float) -> FakeProbe:
        self.calls.append(("probe_nodes", ",".join(nodes)))
        # a launch on a dead slurmd fails after MessageTimeout; a live node answers at once
        said = {n: "srun: error: Task launch for StepId=42.1 failed on node "
                   f"{n}: Communication connection failure" if n in self.dead else None
                for n in nodes}
        done = self.now + (min(MESSAGE_S, timeout) if any(said.values()) else 0.0)
        return FakeProbe(self, tuple(nodes), said, done)

    def start_step(self, argv: Sequence[str], env: Mapping[str, str]) -> FakeStep:
        plan = self.steps[min(len(self.started), len(self.steps) - 1)]
        for ended in self.started:      # its processes are gone, and their relay locks
            for relay in ended.relays.values():
                relay.close()
        placed = next((a.split("=", 1)[1].split(",") for a in argv
                       if a.startswith("--nodelist=")), list(self.nodes))
        step = FakeStep(self, self.kind, dict(env), started=self.now, nodes=placed, **plan)
        self.started.append(step)
        self.calls.append(("start_step", *placed))
        return step
