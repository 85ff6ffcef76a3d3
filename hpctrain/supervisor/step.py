"""The training step: the launcher command (srun ...) as the supervisor's child process,
and the environment it gets. Started through :class:`hpctrain.supervisor.scheduler.Slurm`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

from hpctrain import protocol as p
from hpctrain.slurm.view import JobView
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.statedir import StateDir


def step_env(cfg: Config, state: StateDir, view: JobView | None, last_cause: str | None,
             attempt: int = 0, channel: Mapping[str, str] | None = None,
             world: int = 0) -> dict[str, str]:
    """The step's environment: the batch step's, plus what the ranks read (the protocol's
    files, the run id, the restart count and in-place attempt, the stop signals,
    ``channel``: how to reach the supervisor's progress board, and the rendezvous port
    when it moved; ``world``: a shrunk step's ranks, its layout said anew and the full dp
    width beside it, from which the ranks take their accumulation)."""
    env = {k: v for k, v in os.environ.items() if k != p.EARLY_SIGNALS}
    env.update({p.STATE_DIR: str(state.path), p.EXIT_FILE: str(state.file(p.EXIT)),
                p.STOP_FILE: str(state.file(p.STOP)), p.RUN_ID: state.run_id,
                p.RESTART_COUNT: str(cfg.restart_count), p.STEP_ATTEMPT: str(attempt),
                p.HEARTBEAT_S: f"{cfg.limits.beat_s:g}",
                p.STOP_SIGNALS: ",".join(dict.fromkeys((cfg.requeue_signal, "TERM"))),
                # submitit's in-task handler (function jobs) takes the same signal
                "SUBMITIT_PREEMPT_SIGNAL": cfg.requeue_signal})
    env.update(channel or {})
    if world and world != cfg.world:
        group = cfg.tp * cfg.pp
        env.update({p.WORLD_SIZE: str(world), p.NODES: str(world * cfg.nodes // cfg.world),
                    p.DP: str(world // group), p.FULL_DP: str(cfg.world // group)})
    if last_cause:
        env[p.LAST_EXIT_CAUSE] = last_cause
    if not env.get("SLURM_JOB_END_TIME") and view is not None and view.end_time:
        # Slurm before 23.02 does not set it; the runtime tells warnings apart by it
        env["SLURM_JOB_END_TIME"] = f"{view.end_time:.0f}"
    return env


class Step:
    """A running training step."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        # stdout/stderr stay the batch step's own (the job log); nothing reads stdin
        self.proc = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL)

    def poll(self) -> int | None:
        """The exit status once it ended (128+N when signal N killed it), else None."""
        code = self.proc.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def kill_local(self, signal_name: str) -> None:
        """Signal the local launcher process (srun) directly."""
        try:
            os.kill(self.proc.pid, signal.Signals["SIG" + signal_name])
        except ProcessLookupError:
            pass
