"""What the supervisor is told: the launcher command (its argv) and the rendered script's
exports (the spec's requeue settings) plus Slurm's own variables. Pure parsing of a mapping."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpctrain import protocol as p
from hpctrain.protocol import defaults, nodemem
from hpctrain.errors import SupervisorError
from hpctrain.mesh import shrink_widths
from hpctrain.supervisor.elastic import resized
from hpctrain.supervisor.decision import Budget, Caught
from hpctrain.supervisor.watchdog import Limits
from hpctrain.supervisor.slow import SlowRule

# signals whose default action ends a process: a plain script stops on them
TERMINATING = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM")


@dataclass(frozen=True)
class Config:
    """One run of one job, as the supervisor sees it."""

    argv: tuple[str, ...]      # the launcher command: srun ... (the training step)
    key: str                   # 123, or 120_3 for an array task
    restart_count: int
    cluster: str
    launcher: str              # torchrun | srun | deepspeed
    requeue_signal: str        # USR2: the time-limit warning (--signal=B:USR2@lead)
    budget: Budget
    base: str                  # where the state directory lives: checkpoint dir, else submit dir
    submission: str = ""       # hpctrain submit's id for this submission, if it made one
    early: tuple[Caught, ...] = ()
    where: str = ""            # "4 rank(s) on {nodes}, rendezvous n1:{port}": see where_on
    signal_lead_s: int = 0     # --signal=B:SIG@lead: the warning comes lead s before the end
    limits: Limits = Limits()  # the hang watchdog's timeouts ([watchdog])
    max_step_restarts: int = defaults.MAX_STEP_RESTARTS  # in-allocation, the whole job
    exclude_bad_nodes: bool = defaults.EXCLUDE_BAD_NODES
    world: int = 1             # ranks of the step (HPCTRAIN_WORLD_SIZE)
    nodes: int = 1             # nodes of the step (HPCTRAIN_NODES)
    nodelist: str = ""         # the allocation's nodes (SLURM_JOB_NODELIST)
    job_nodes: int = 0         # how many (SLURM_JOB_NUM_NODES): spares included
    health_check: tuple[str, ...] = ()   # the partition's node check (argv), run per node
    health_check_timeout_s: int = defaults.HEALTH_CHECK_TIMEOUT_S
    container: dict | None = None        # the step's container (HPCTRAIN_CONTAINER), if any
    submit_dir: str = ""                 # SLURM_SUBMIT_DIR: mounted into a container
    spare_nodes: int = 0                 # [elastic]: nodes held to replace a lost one
    min_nodes: int = 0                   # [elastic]: the fewest to shrink to (0: never)
    tp: int = 1                          # the layout (HPCTRAIN_TP, HPCTRAIN_PP): a shrink
    pp: int = 1                          # keeps whole model-parallel groups
    peer_copies: bool = False            # [elastic]: snapshots kept in node memory too
    on_slow: str = ""                    # [health]: replace, exclude, report ("": by spares)
    slow_rule: SlowRule = SlowRule()     # [health]: when a node is slow
    preflight: bool = False              # [health]: a GEMM timed on each node first
    batch_node: str = ""                 # SLURMD_NODENAME: where this supervisor runs
    master_addr: str = ""                # the rendezvous (MASTER_ADDR, MASTER_PORT): the
    master_port: int = 0                 # script's choice (supervisor/rendezvous.py)

    def where_on(self, nodes: str, port: int = 0, world: int = 0) -> str:
        """Where the step runs, for the job log: its ranks (``world``: a shrunk step's) on
        ``nodes``, the rendezvous (on ``port`` when it moved from the script's)."""
        return self.where.replace("{nodes}", nodes).replace(
            "{port}", str(port or self.master_port or "?")).replace(
            "{world}", str(world or self.world))

    @property
    def shrinks(self) -> bool:
        """[elastic] min_nodes: may the step go on on fewer nodes when no spare is left?"""
        return 0 < self.min_nodes < self.nodes

    @property
    def elastic(self) -> bool:
        """Does a lost node cost a restart in this allocation (a spare, or a shrink)
        instead of a requeue: found by its ranks' silence, taken from the job?"""
        return bool(self.spare_nodes) or self.shrinks

    @property
    def widths(self) -> list[int]:
        """The node counts the step may run on, the full one first: [elastic] min_nodes's
        smaller ones (whole model-parallel groups, the global batch kept) when the
        launcher's argv can be resized to them (:func:`~.elastic.resized`)."""
        if not self.shrinks:
            return [self.nodes]
        smaller = shrink_widths(self.nodes, self.min_nodes, self.world // self.nodes,
                                self.tp, self.pp)
        return [self.nodes, *(w for w in smaller
                              if resized(self.argv, w, self.nodes) is not None)]

    @property
    def step_signal(self) -> str:
        """What the step gets when it must stop: torchrun's agent passes on only TERM; a
        plain script dies of the requeue signal only if it is one that ends a process."""
        if self.launcher == "torchrun" or self.requeue_signal not in TERMINATING:
            return "TERM"
        return self.requeue_signal

    @classmethod
    def from_env(cls, argv: Sequence[str], env: Mapping[str, str]) -> Config:
        """Raise SupervisorError naming the variable and the fix when something is off."""
        args = list(argv)
        if args[:1] == ["--"]:
            args = args[1:]
        if not args:
            raise SupervisorError("no training step to run: the rendered script must end with "
                                  "`exec python -m hpctrain.supervisor -- LAUNCHER ...` "
                                  "(render it again with `hpctrain render`)")
        key = p.job_key(env)
        if not key:
            raise SupervisorError("SLURM_JOB_ID is not set: the supervisor runs inside a Slurm "
                                  "batch job (submit the script with sbatch or hpctrain submit)")
        # the spec's defaults (protocol.defaults), when run by hand
        total = _int(env, p.MAX_REQUEUES, defaults.MAX_REQUEUES)
        capped = defaults.capped_limit(total)
        limits_of = {
            "preemption": _int(env, p.MAX_PREEMPTIONS, total),
            "time_limit": _int(env, p.MAX_TIME_LIMITS, total),
            "node_fail": _int(env, p.MAX_NODE_FAILURES, capped),
            "storage": _int(env, p.MAX_STORAGE_RETRIES, capped),
            "hang": _int(env, p.MAX_HANGS, capped)}
        crash = _opt_int(env, p.MAX_CRASH_RESTARTS)
        if crash is not None:   # left out: Budget.limit_of's default, by the script's kind
            limits_of["user_crash"] = crash
        budget = Budget(total, limits_of)
        limits = Limits.from_spec(_opt_int(env, p.HANG_TIMEOUT_S),
                                  _opt_int(env, p.STARTUP_TIMEOUT_S),
                                  _opt_int(env, p.SAVE_TIMEOUT_S),
                                  _float(env, p.HEARTBEAT_S, p.DEFAULT_HEARTBEAT_S),
                                  _opt_int(env, p.COLLECTIVE_TIMEOUT_S))
        return cls(
            argv=tuple(args), key=key, restart_count=_int(env, "SLURM_RESTART_COUNT", 0),
            cluster=env.get("SLURM_CLUSTER_NAME", ""),
            launcher=env.get(p.LAUNCHER, "srun"),
            requeue_signal=(env.get(p.REQUEUE_SIGNAL, defaults.REQUEUE_SIGNAL).upper()
                            .removeprefix("SIG")),
            budget=budget,
            base=env.get(p.CKPT_DIR) or env.get("SLURM_SUBMIT_DIR") or env.get("PWD", "."),
            submission=env.get(p.SUBMISSION_ID, ""),
            early=parse_early(env.get(p.EARLY_SIGNALS, "")),
            signal_lead_s=_int(env, p.SIGNAL_LEAD_S, 0),
            limits=limits,
            max_step_restarts=_int(env, p.MAX_STEP_RESTARTS, defaults.MAX_STEP_RESTARTS),
            exclude_bad_nodes=(env.get(p.EXCLUDE_BAD_NODES, str(int(defaults.EXCLUDE_BAD_NODES)))
                               not in ("0", "false")),
            world=_int(env, p.WORLD_SIZE, 1), nodes=_int(env, p.NODES, 1),
            nodelist=env.get("SLURM_JOB_NODELIST", ""),
            job_nodes=_int(env, "SLURM_JOB_NUM_NODES", 0),
            health_check=parse_argv(env, p.HEALTH_CHECK),
            health_check_timeout_s=_int(env, p.HEALTH_CHECK_TIMEOUT_S,
                                        defaults.HEALTH_CHECK_TIMEOUT_S),
            container=parse_container(env), submit_dir=env.get("SLURM_SUBMIT_DIR", ""),
            spare_nodes=_int(env, p.SPARE_NODES, 0), min_nodes=_int(env, p.MIN_NODES, 0),
            tp=_int(env, p.TP, 1), pp=_int(env, p.PP, 1),
            peer_copies=env.get(nodemem.PEER_COPIES) == "1",
            on_slow=env.get(p.ON_SLOW, ""), preflight=env.get(p.PREFLIGHT) == "1",
            slow_rule=SlowRule(_float(env, p.SLOW_FACTOR, defaults.SLOW_FACTOR),
                               _float(env, p.SLOW_FOR_S, defaults.SLOW_FOR_S)),
            batch_node=env.get("SLURMD_NODENAME", ""),
            master_addr=env.get("MASTER_ADDR", ""), master_port=_int(env, "MASTER_PORT", 0),
            where="{world} rank(s) on {nodes}, rendezvous "
                  f"{env.get('MASTER_ADDR', '?')}:{{port}}")


def parse_early(text: str) -> tuple[Caught, ...]:
    """``" USR2@1795418146 TERM@1795418150"`` (the batch shell's traps) -> Caught signals."""
    out = []
    for word in text.split():
        name, _, at = word.partition("@")
        try:
            out.append(Caught(name.upper().removeprefix("SIG"), float(at or 0), early=True))
        except ValueError:
            continue
    return tuple(out)


_RENDER_AGAIN = "render the script again with `hpctrain render` (it sets the spec's values)"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    return p.env_int(env, name, default, error=SupervisorError, fix=_RENDER_AGAIN)


def _opt_int(env: Mapping[str, str], name: str) -> int | None:
    """An integer setting that may be absent (None: the default applies)."""
    return p.env_int(env, name, None, error=SupervisorError, fix=_RENDER_AGAIN)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name) or default)
    except ValueError:
        raise SupervisorError(f"{name}={env.get(name)!r} is not a number of seconds") from None


def parse_container(env: Mapping[str, str]) -> dict | None:
    """The step's container as the rendered script exports it (JSON), None without one."""
    raw = env.get(p.CONTAINER, "")
    if not raw:
        return None
    try:
        plan = json.loads(raw)
    except ValueError:
        plan = None
    if not isinstance(plan, dict) or not isinstance(plan.get("image"), str):
        raise SupervisorError(f"{p.CONTAINER}={raw!r} is not the container hpctrain renders: "
                              "render the script again with `hpctrain render`")
    return plan


def parse_argv(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A command exported as a JSON list of words (empty when unset)."""
    raw = env.get(name, "")
    if not raw:
        return ()
    try:
        words = json.loads(raw)
    except ValueError:
        words = None
    if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
        raise SupervisorError(f"{name}={raw!r} is not a JSON list of words: render the script "
                              "again with `hpctrain render` (it comes from the partition file)")
    return tuple(words)
