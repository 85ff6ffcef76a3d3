"""Where am I? Pure parsing of the SLURM / torchrun environment into an :class:`Environment`.

No torch, no I/O: :meth:`Environment.from_env` takes any mapping (``os.environ`` by
default), so every case is unit-testable. torchrun's variables win over SLURM's
because under ``srun torchrun`` SLURM_PROCID numbers the *launchers*, not the ranks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain import hostlist, protocol
from hpctrain.errors import LayoutError, SpecError
from hpctrain.mesh import rank_to_coords  # the one rank numbering (Megatron order)


@dataclass(frozen=True)
class Environment:
    """The facts a training process needs about its place in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    job_id: str | None  # the job key: "123", or "120_3" for an array task (protocol.job_key)
    slurm_job_id: str | None  # the raw SLURM_JOB_ID (unique per array task)
    restart_count: int  # SLURM_RESTART_COUNT: how often Slurm requeued this job
    tp: int
    dp: int
    pp: int
    master_addr: str
    master_port: int
    exit_file: str | None  # HPCTRAIN_EXIT_FILE: where exit_for_requeue leaves its record
    stop_file: str | None  # HPCTRAIN_STOP_FILE: the supervisor's word on a stop signal
    last_exit_cause: str | None  # HPCTRAIN_LAST_EXIT_CAUSE, set by the supervisor
    run_id: str | None  # HPCTRAIN_RUN_ID: the job's id, stable across requeues
    node: str | None  # SLURMD_NODENAME: the node this rank runs on
    job_end_time: float | None  # SLURM_JOB_END_TIME (epoch s), to tell preemption by USR2
    signal_lead_s: float | None  # HPCTRAIN_SIGNAL_LEAD_S, the template's --signal lead
    model_params: float | None = None  # HPCTRAIN_MODEL_PARAMS: the spec's [model] params
    model_mode: str = "train"          # HPCTRAIN_MODEL_MODE: ...and how it is trained
    full_dp: int | None = None  # HPCTRAIN_FULL_DP: a shrunk step's full data-parallel width

    @property
    def accumulation(self) -> int:
        """Micro-batches a rank takes each step to keep the global batch: 1 at full width;
        after a shrink ([elastic] min_nodes) the full dp over the dp now (4 -> 2: 2)."""
        return self.full_dp // self.dp if self.full_dp else 1

    @property
    def coords(self) -> tuple[int, int, int]:
        """(pp_rank, dp_rank, tp_rank) of this rank."""
        return rank_to_coords(self.rank, self.tp, self.dp, self.pp)

    @property
    def in_slurm(self) -> bool:
        return self.slurm_job_id is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Environment:
        """Parse ``env`` (default ``os.environ``); raise SpecError/LayoutError on bad values."""
        env = os.environ if env is None else env
        rank = _int(env, "RANK", _int(env, "SLURM_PROCID", 0))
        world = _int(env, "WORLD_SIZE", _int(env, "SLURM_NTASKS", 1))
        local_rank = _int(env, "LOCAL_RANK", _int(env, "SLURM_LOCALID", 0))
        # the step's nodes (SLURM_NNODES), not the job's: [elastic] spare nodes are not in it
        num_nodes = _int(env, "SLURM_NNODES", _int(env, "SLURM_JOB_NUM_NODES", 1))
        local_world = _int(env, "LOCAL_WORLD_SIZE", _slurm_tasks_per_node(env, world, num_nodes))
        node_rank = _int(env, "GROUP_RANK", _int(env, "SLURM_NODEID", 0))
        if world < 1 or not 0 <= rank < world:
            raise SpecError(f"rank {rank} is outside world size {world}: check RANK/WORLD_SIZE "
                            "(torchrun) or SLURM_PROCID/SLURM_NTASKS (srun)")
        tp, dp, pp = _layout(env, world)
        slurm_job = env.get("SLURM_JOB_ID") or None
        return cls(
            rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
            node_rank=node_rank, num_nodes=num_nodes, job_id=protocol.job_key(env),
            slurm_job_id=slurm_job, restart_count=_int(env, "SLURM_RESTART_COUNT", 0),
            tp=tp, dp=dp, pp=pp,
            master_addr=env.get("MASTER_ADDR") or hostlist.first(env.get("SLURM_JOB_NODELIST", "")),
            master_port=_int(env, "MASTER_PORT", protocol.master_port(slurm_job)),
            exit_file=env.get(protocol.EXIT_FILE) or None,
            stop_file=env.get(protocol.STOP_FILE) or None,
            last_exit_cause=env.get(protocol.LAST_EXIT_CAUSE) or None,
            run_id=env.get(protocol.RUN_ID) or None,
            node=_node(env),
            job_end_time=_float(env, "SLURM_JOB_END_TIME"),
            signal_lead_s=_float(env, protocol.SIGNAL_LEAD_S),
            model_params=_float(env, protocol.MODEL_PARAMS),
            model_mode=env.get(protocol.MODEL_MODE) or "train",
            full_dp=_full_dp(env, dp),
        )


def _full_dp(env: Mapping[str, str], dp: int) -> int | None:
    """The job's full dp width when the supervisor shrank this step (None: not shrunk)."""
    if protocol.FULL_DP not in env:
        return None
    full = _int(env, protocol.FULL_DP, dp)
    if full < dp or full % dp:
        raise LayoutError(f"{protocol.FULL_DP}={full} is not a multiple of the step's dp={dp}: "
                          "the supervisor sets both when it shrinks a step; do not set it")
    return full if full != dp else None


def _node(env: Mapping[str, str]) -> str | None:
    """SLURMD_NODENAME, unless it cannot be trusted: in a step of Slurm's own OCI
    containers (22.05) every node's tasks get one task's Slurm variables (SLURM_PROCID=0,
    the first node's SLURMD_NODENAME, found on the devcluster). Better no node than the
    wrong one: the watchdog would name, and exclude, a healthy node."""
    if env.get("SLURM_CONTAINER"):
        return None
    return env.get("SLURMD_NODENAME") or None


def _layout(env: Mapping[str, str], world: int) -> tuple[int, int, int]:
    tp, pp = _int(env, protocol.TP, 1), _int(env, protocol.PP, 1)
    if tp < 1 or pp < 1:
        raise LayoutError(f"{protocol.TP}={tp}, {protocol.PP}={pp}: both must be >= 1")
    if protocol.DP in env:
        dp = _int(env, protocol.DP, 1)
    elif world % (tp * pp) == 0:
        dp = world // (tp * pp)
    else:
        dp = 0  # reported below
    if dp < 1 or tp * dp * pp != world:
        raise LayoutError(
            f"layout tp={tp} x dp={dp} x pp={pp} = {tp * dp * pp} ranks, but the job has "
            f"world size {world}: set {protocol.TP}/{protocol.DP}/{protocol.PP} so their "
            f"product is {world} (or leave {protocol.DP} unset to derive it)")
    return tp, dp, pp


def _slurm_tasks_per_node(env: Mapping[str, str], world: int, nodes: int) -> int:
    # SLURM_NTASKS_PER_NODE is set only with --ntasks-per-node; may read "2(x3)"
    raw = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    match = re.match(r"^(\d+)", raw)
    return int(match.group(1)) if match else max(1, world // max(1, nodes))


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    return protocol.env_int(env, name, default, error=SpecError,
                            fix="unset it or give a whole number")


def _float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise SpecError(f"environment variable {name}={raw!r} is not a number: "
                        f"unset it or give a number") from None
