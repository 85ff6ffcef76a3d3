"""The batch protocol's shared vocabulary: environment names, a job's state directory and
its ``key=value`` records, defined once.

Three parties use it: the job supervisor (``hpctrain.supervisor``, which owns the batch
step and writes most of it), the training processes (``hpctrain.runtime``, which read the
stop notice and leave an exit record) and ``hpctrain status`` (which reads it with plain
file reads). Pure standard library: no torch, no Slurm, cheap to import anywhere.

A job's state directory, on storage every node sees (``state_dir``)::

    <checkpoint dir, else the submit dir>/.hpctrain/jobs/<job key>/
        identity   who owns this directory: run_id, cluster, job key, submission id
        ledger     one line per requeue, and a ``stop`` line when a limit ended the job
        stop       the supervisor's stop notice to the training processes (why a signal came)
        exit       the runtime's exit record (a requeue request, or a crash and its error)
        outcome    the supervisor's verdict on the last run (cause, action, rank, node, error)
        summary    rank 0's newest progress record, rewritten at most every 15 s by the
                   supervisor (``hpctrain status``'s live line when the supervisor
                   cannot be asked), and at once as the step ends (its final step)
        live       where the running supervisor answers ``hpctrain status`` and the
                   secret a request must prove (0600; :mod:`hpctrain.protocol.live`)
        stacks/rank-N     a rank's Python stacks, asked for by the supervisor (a hang)
        history    rank 0's progress over time, one JSON line per step boundary and phase
                   change (``hpctrain report`` reads it)

Each rank's progress (``progress/rank-N``: step, phase, heartbeat) and the supervisor's
requests to the ranks (``dump``: every rank's stacks; ``interrupt``: leave the attempt;
``resume``: go on with the next attempt in the same processes, or stop) live in a
node-local directory and travel over the network (:mod:`hpctrain.protocol.channel`), not
on shared storage; without a supervisor's channel they fall back to the state directory.

The job key is the Slurm job id, or ``<array job id>_<task id>`` for an array task (the
bare id of an array task can equal the array's id, which Slurm reads as every task).
Exit codes live with their causes in :mod:`hpctrain.runtime.causes`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from hpctrain.files import atomic_write

_D = TypeVar("_D")   # env_int's default: an int, or None for "not given"

# ---- environment: set by the rendered script or the supervisor, read by the others ------
STATE_DIR = "HPCTRAIN_STATE_DIR"              # the job's state directory (this module)
EXIT_FILE = "HPCTRAIN_EXIT_FILE"              # where the runtime leaves its exit record
STOP_FILE = "HPCTRAIN_STOP_FILE"              # where the supervisor leaves its stop notice
RUN_ID = "HPCTRAIN_RUN_ID"                    # stable across requeues of one job
RESTART_COUNT = "HPCTRAIN_RESTART_COUNT"      # SLURM_RESTART_COUNT, 0 on the first run
LAST_EXIT_CAUSE = "HPCTRAIN_LAST_EXIT_CAUSE"  # why the previous run ended (restarts only)
STOP_SIGNALS = "HPCTRAIN_STOP_SIGNALS"        # signals the runtime routes to its stop flag
EARLY_SIGNALS = "HPCTRAIN_EARLY_SIGNALS"      # caught by the batch shell before the handover
SUBMISSION_ID = "HPCTRAIN_SUBMISSION_ID"      # set by `hpctrain submit` in sbatch's environment
SNAPSHOT_ID = "HPCTRAIN_SNAPSHOT_ID"          # the code snapshot the job runs ([run] snapshot)
SNAPSHOT_DIR = "HPCTRAIN_SNAPSHOT_DIR"        # where that copy is (the job's working directory)
# the job's shape, as the rendered script exports it (docs/spec.md): read by the runtime
# (the layout) and the supervisor (the step's size)
JOB_NAME = "HPCTRAIN_JOB_NAME"
PARTITION = "HPCTRAIN_PARTITION"
NODES = "HPCTRAIN_NODES"
GPUS_PER_NODE = "HPCTRAIN_GPUS_PER_NODE"
WORLD_SIZE = "HPCTRAIN_WORLD_SIZE"
TP, PP, DP = "HPCTRAIN_TP", "HPCTRAIN_PP", "HPCTRAIN_DP"
# a function job's rank's coordinates in that layout (hpctrain.runtime.function)
TP_RANK, PP_RANK, DP_RANK = "HPCTRAIN_TP_RANK", "HPCTRAIN_PP_RANK", "HPCTRAIN_DP_RANK"
TIME_LIMIT_S = "HPCTRAIN_TIME_LIMIT_S"        # the job's time limit in seconds (0: none)
# how `hpctrain --host` starts hpctrain on the cluster (the CLI's option, remote/ssh.py)
REMOTE_COMMAND = "HPCTRAIN_REMOTE_COMMAND"
# "0": every --host command over plain ssh, no warm server (hpctrain.remote.warm, .server)
REMOTE_SERVER = "HPCTRAIN_REMOTE_SERVER"
# [checkpoint], for CheckpointManager()'s defaults (hpctrain.checkpoint.settings)
CKPT_DIR = "HPCTRAIN_CKPT_DIR"
CKPT_ACCESS = "HPCTRAIN_CKPT_ACCESS"
CKPT_INTERVAL_STEPS = "HPCTRAIN_CKPT_INTERVAL_STEPS"
CKPT_KEEP_LAST = "HPCTRAIN_CKPT_KEEP_LAST"
CKPT_KEEP_EVERY = "HPCTRAIN_CKPT_KEEP_EVERY"
CKPT_STRIPE_COUNT = "HPCTRAIN_CKPT_STRIPE_COUNT"
LAUNCHER = "HPCTRAIN_LAUNCHER"
MODEL_PARAMS = "HPCTRAIN_MODEL_PARAMS"        # [model] params: a step's FLOPs, for report
MODEL_MODE = "HPCTRAIN_MODEL_MODE"            # [model] mode: train, lora, qlora, inference
REQUEUE_SIGNAL = "HPCTRAIN_REQUEUE_SIGNAL"
SPARE_NODES = "HPCTRAIN_SPARE_NODES"          # [elastic] spare_nodes: nodes beyond the step's
MIN_NODES = "HPCTRAIN_MIN_NODES"              # [elastic] min_nodes: the fewest to shrink to
FULL_DP = "HPCTRAIN_FULL_DP"                  # a shrunk step's: the job's full dp width
SIGNAL_LEAD_S = "HPCTRAIN_SIGNAL_LEAD_S"
ON_SLOW = "HPCTRAIN_ON_SLOW"                  # [health] on_slow: replace, exclude, report
SLOW_FACTOR = "HPCTRAIN_SLOW_FACTOR"          # [health] slow_factor and slow_for_s
SLOW_FOR_S = "HPCTRAIN_SLOW_FOR_S"
PREFLIGHT = "HPCTRAIN_PREFLIGHT"              # [health] preflight: 1 to time each node first
MAX_REQUEUES = "HPCTRAIN_MAX_REQUEUES"
MAX_PREEMPTIONS = "HPCTRAIN_MAX_PREEMPTIONS"
MAX_TIME_LIMITS = "HPCTRAIN_MAX_TIME_LIMITS"
MAX_NODE_FAILURES = "HPCTRAIN_MAX_NODE_FAILURES"
MAX_CRASH_RESTARTS = "HPCTRAIN_MAX_CRASH_RESTARTS"
MAX_STORAGE_RETRIES = "HPCTRAIN_MAX_STORAGE_RETRIES"
MAX_HANGS = "HPCTRAIN_MAX_HANGS"
STEP_ATTEMPT = "HPCTRAIN_STEP_ATTEMPT"        # in-allocation restarts of this run so far
HEARTBEAT_S = "HPCTRAIN_HEARTBEAT_S"          # how often a rank rewrites its progress record
HANG_TIMEOUT_S = "HPCTRAIN_HANG_TIMEOUT_S"    # the [watchdog] table, for the supervisor
STARTUP_TIMEOUT_S = "HPCTRAIN_STARTUP_TIMEOUT_S"
SAVE_TIMEOUT_S = "HPCTRAIN_SAVE_TIMEOUT_S"
# the training's process-group timeout: a collective waits this long for a peer, then raises
COLLECTIVE_TIMEOUT_S = "HPCTRAIN_COLLECTIVE_TIMEOUT_S"
# the [watchdog] defaults with hpctrain.runtime (the spec's check and the supervisor agree)
DEFAULT_HANG_S, DEFAULT_STARTUP_S, DEFAULT_SAVE_S = 300, 1800, 1800
# a collective_timeout_s given is at most this much longer than the hang timeout: a rank
# waiting for a hung peer gives up soon after the watchdog would have found the hang
COLLECTIVE_MARGIN_S = 30
MAX_STEP_RESTARTS = "HPCTRAIN_MAX_STEP_RESTARTS"
EXCLUDE_BAD_NODES = "HPCTRAIN_EXCLUDE_BAD_NODES"
HEALTH_CHECK = "HPCTRAIN_HEALTH_CHECK"        # the partition's node check: a JSON argv list
HEALTH_CHECK_TIMEOUT_S = "HPCTRAIN_HEALTH_CHECK_TIMEOUT_S"
CONTAINER = "HPCTRAIN_CONTAINER"              # the step's container (JSON), for an OCI bundle
# the job-private cache directory the script made (.hpctrain-cache/<job id>): the
# supervisor removes it once the job ends for good (hpctrain.supervisor.caches)
JOB_CACHE = "HPCTRAIN_CONTAINER_CACHE"
JOB_CACHE_DIR = ".hpctrain-cache"                # under the submit directory


def env_int(env: Mapping[str, str], name: str, default: _D, *,
            error: Callable[[str], Exception] | None = ValueError,
            fix: str = "unset it or give a whole number") -> int | _D:
    """``$name`` of ``env`` as a whole number, ``default`` when it is unset or blank: the
    one reader of the integers the script and the supervisor export (the supervisor's
    settings, the runtime's layout, the checkpoint manager's defaults). A value that is not
    a whole number raises ``error`` with a message naming the variable and ``fix``; with
    ``error=None`` it counts as unset (a reader that must never fail)."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        if error is None:
            return default
        raise error(f"{name}={raw!r} is not a whole number: {fix}") from None


# ---- the rendezvous port: one rule for the template, the runtime and function jobs ---------
# 25000-28999 from the job id: clear of Slurm's own ports, of the ephemeral range (32768+),
# of torch's defaults (29400 for torchrun's rendezvous, 29500) and of Lightning's (15000 +
# the job id's last 4 digits: 15000-24999); two jobs sharing a node collide only if their
# ids are 4000 apart, and then the script takes the next free port (templates: rendezvous)
PORT_BASE, PORT_SPAN = 25000, 4000


def master_port(slurm_job_id: str | int | None) -> int:
    """MASTER_PORT of job ``slurm_job_id`` (the raw SLURM_JOB_ID); outside Slurm, torch's own
    default 29500."""
    digits = str(slurm_job_id or "").strip()
    return PORT_BASE + int(digits) % PORT_SPAN if digits.isdigit() else 29500


def port_after(port: int, k: int = 1) -> int:
    """The ``k``-th port after ``port`` in the job's range (PORT_BASE.. + PORT_SPAN, round):
    where the rendezvous goes when ``port`` is taken (the template's loop, the supervisor's
    retry after a failed bind)."""
    return PORT_BASE + (port - PORT_BASE + k) % PORT_SPAN


# ---- the state directory ------------------------------------------------------------------
STATE_SUBDIR = (".hpctrain", "jobs")
IDENTITY, LEDGER, STOP, EXIT, OUTCOME = "identity", "ledger", "stop", "exit", "outcome"
PROGRESS, DUMP, STACKS, HISTORY = "progress", "dump", "stacks", "history"
SUMMARY, LIVE = "summary", "live"
INTERRUPT, RESUME = "interrupt", "resume"
DEFAULT_HEARTBEAT_S = 2.0


def rank_file(state: str | os.PathLike[str], kind: str, rank: int) -> Path:
    """``<state>/progress/rank-3`` (kind PROGRESS) or ``<state>/stacks/rank-3`` (STACKS)."""
    return Path(state) / kind / f"rank-{rank}"


def job_key(env: Mapping[str, str]) -> str | None:
    """The job's key: ``<array job id>_<task id>`` for an array task, else SLURM_JOB_ID."""
    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return env.get("SLURM_JOB_ID") or None


def state_dir(base: str | os.PathLike[str], key: str) -> Path:
    """The state directory of job ``key`` under ``base`` (checkpoint dir or submit dir)."""
    return Path(base).joinpath(*STATE_SUBDIR, key)


# ---- key=value records (identity, stop, exit, outcome) ---------------------------------------
# (the wire form; the stop notice, exit record and verdict are typed in
# :mod:`hpctrain.protocol.records`, and read through their parsers only)
def format_record(fields: Mapping[str, object]) -> str:
    """``key=value`` lines; a value must be one line (grep-able, and no record injection)."""
    lines = []
    for key, value in fields.items():
        text = str(value)
        if "\n" in text or "\r" in text or "=" in key:
            raise ValueError(f"record field {key!r}={text!r} must be one line")
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


def parse_record(text: str) -> dict[str, str]:
    """Inverse of :func:`format_record`; ignores blank and malformed lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def write_record(path: str | os.PathLike[str], fields: Mapping[str, object]) -> None:
    """Write atomically (tmp + rename), so a kill mid-write leaves the old record or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, format_record(fields))


def read_record(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """The record at ``path``, or {} when there is none (or it cannot be read)."""
    if not path:
        return {}
    try:
        return parse_record(Path(path).read_text())
    except (OSError, UnicodeDecodeError):
        return {}


def find_state_dir(key: str, *bases: str) -> Path | None:
    """The state directory of job ``key`` under the first of ``bases`` (checkpoint dir,
    submit dir) that has one; None when none does."""
    for base in bases:
        if base and state_dir(base, key).is_dir():
            return state_dir(base, key)
    return None


def find_record(key: str, name: str, *bases: str) -> dict[str, str]:
    """Record ``name`` (``outcome``, ``exit``) of job ``key`` from the first of ``bases``
    (checkpoint dir, submit dir) whose state directory has one; {} when none does."""
    for base in bases:
        if base:
            found = read_record(state_dir(base, key) / name)
            if found:
                return found
    return {}


def read_history(state: str | os.PathLike[str], tail_bytes: int = 0) -> list[dict]:
    """Rank 0's history in state directory ``state``: its JSON events, oldest first (only
    the last ``tail_bytes`` when given); lines cut short by a kill are skipped."""
    try:
        with open(Path(state) / HISTORY, "rb") as fh:
            if tail_bytes:
                fh.seek(0, 2)
                fh.seek(max(0, fh.tell() - tail_bytes))
            lines = fh.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("t"), (int, float)):
            events.append(event)
    return events
