"""The job spec: what a researcher wants, as frozen dataclasses read from TOML.

A spec is checked on construction (types, names, Slurm time formats, every value
that will reach the script), so a :class:`JobSpec` that exists is well formed. Whether
it *fits* a partition (GPUs per node, layout divisibility, time limit) is the job of
:func:`hpctrain.spec.layout.plan_layout`. Everything here is pure: no environment, no
subprocess; :meth:`JobSpec.load` only reads the one file it is given.

Field reference: docs/spec.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpctrain.errors import SpecError
from hpctrain.protocol import COLLECTIVE_MARGIN_S, DEFAULT_HANG_S, DEFAULT_SAVE_S, defaults
from hpctrain.spec.checkpoint import CheckpointSpec
from hpctrain.spec.checks import (MAIL_RE, check_directive_value, check_int, check_mail_type,
                                  check_name, check_opt_int, check_sbatch_option,
                                  check_signal, check_table,
                                  check_text, closest, slurm_time_seconds)
from hpctrain.spec.container import ContainerSpec, Mount
from hpctrain.spec.elastic import ElasticSpec
from hpctrain.spec.health import HealthSpec
from hpctrain.spec.launch import local_rank_arg
from hpctrain.spec.resources import ResourceSpec
from hpctrain.spec.runenv import access_level, env_key, env_value, passthrough_names
from hpctrain.spec.source import read_toml
from hpctrain.spec.workload import ModelSpec

LAUNCHERS = ("torchrun", "srun", "deepspeed")


# ---- small typed readers: each names the key and the fix ------------------------------
def _str_list(value: Any, where: str, *, allow_empty: bool = True,
              newlines: bool = False) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise SpecError(f"{where}={value!r} must be a list of strings, e.g. "
                        f'{where} = ["python", "train.py"]')
    items = tuple(check_text(v, f"{where}[{i}]", newlines=newlines) for i, v in enumerate(value))
    if not allow_empty and (not items or items[0] == ""):
        raise SpecError(f"{where} is empty: give the program and its arguments, e.g. "
                        f'{where} = ["python", "train.py"]')
    return items


# ---- the sections ----------------------------------------------------------------------
@dataclass(frozen=True)
class LayoutSpec:
    """Tensor (tp), pipeline (pp) and data (dp) parallel degrees; dp is derived if absent."""

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> "LayoutSpec":
        d = check_table(data, "layout", cls)
        return cls(tp=check_int(d.get("tp", 1), "layout.tp", 1),
                   pp=check_int(d.get("pp", 1), "layout.pp", 1),
                   dp=check_opt_int(d.get("dp"), "layout.dp", 1),
                   num_layers=check_opt_int(d.get("num_layers"), "layout.num_layers", 1),
                   num_heads=check_opt_int(d.get("num_heads"), "layout.num_heads", 1))


@dataclass(frozen=True)
class RunSpec:
    """What runs: the launcher, the command (argv), setup lines and extra environment."""

    command: tuple[str, ...]
    launcher: str = "torchrun"
    setup: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, hash=False)
    # names whose values come from the submitting environment, never written anywhere
    env_passthrough: tuple[str, ...] = ()
    access: str = "private"   # who may read the job folder: "private" or "group"
    # run from a copy of the source tree in the job folder (hpctrain.jobs.snapshot);
    # None: the submission path decides (off on the login node, on for --host)
    snapshot: bool | None = None
    local_rank_arg: bool = False   # deepspeed: --local_rank=N after the script (spec/launch.py)

    @classmethod
    def from_dict(cls, data: Any) -> "RunSpec":
        d = check_table(data, "run", cls)
        launcher = d.get("launcher", "torchrun")
        if launcher not in LAUNCHERS:
            raise SpecError(f"run.launcher={launcher!r} is not a launcher: use one of "
                            f"{', '.join(LAUNCHERS)}" + closest(str(launcher), LAUNCHERS))
        if "command" not in d:
            raise SpecError('run.command is missing: add command = ["python", "train.py"] '
                            "under [run]")
        env = d.get("env", {})
        if not isinstance(env, Mapping):
            raise SpecError(f"run.env={env!r} must be a table of NAME = \"value\"")
        values = {env_key(k): env_value(k, v) for k, v in env.items()}
        passthrough = passthrough_names(_str_list(d.get("env_passthrough", ()),
                                                  "run.env_passthrough"), values)
        snapshot = d.get("snapshot")
        if snapshot is not None and not isinstance(snapshot, bool):
            raise SpecError(f"run.snapshot={snapshot!r} must be true or false")
        command = _str_list(d["command"], "run.command", allow_empty=False, newlines=True)
        return cls(command=command, launcher=launcher,
                   setup=_str_list(d.get("setup", ()), "run.setup"),
                   env=values, env_passthrough=passthrough, snapshot=snapshot,
                   access=access_level(d.get("access", "private"), "run.access"),
                   local_rank_arg=local_rank_arg(d.get("local_rank_arg", False), launcher,
                                                 command))


@dataclass(frozen=True)
class RequeueSpec:
    """How the job survives preemption, time limits and node loss: signal, lead time, and
    a requeue budget per cause besides the total (a node-killing job then cannot requeue
    forever, and the message names the limit that was hit). ``max_crash_restarts`` left
    out (None): a crash is retried 3 times when the script runs under
    ``hpctrain.runtime.run``, stopping early at the same error at the same step twice, and
    not at all otherwise (a bug is not run again); a number overrides both."""

    # the defaults are the supervisor's too (hpctrain.protocol.defaults)
    max_requeues: int = defaults.MAX_REQUEUES   # every cause together (SLURM_RESTART_COUNT)
    signal: str = defaults.REQUEUE_SIGNAL
    signal_lead_s: int = 120
    max_preemptions: int = defaults.MAX_REQUEUES      # default: max_requeues
    max_time_limits: int = defaults.MAX_REQUEUES      # default: max_requeues
    max_node_failures: int = defaults.CAPPED_CAUSE_LIMIT   # default: 3, at most max_requeues
    max_crash_restarts: int | None = None   # a crash (the step failed on its own): the
    #                                         supervisor's default (above) when None
    # the checkpoint storage unavailable (a dead node's lock)
    max_storage_retries: int = defaults.CAPPED_CAUSE_LIMIT
    # requeues after a hang, once in-place restarts are spent
    max_hangs: int = defaults.CAPPED_CAUSE_LIMIT

    @classmethod
    def from_dict(cls, data: Any) -> "RequeueSpec":
        d = check_table(data, "requeue", cls)
        total = check_int(d.get("max_requeues", defaults.MAX_REQUEUES), "requeue.max_requeues",
                          0, 10000)
        capped = defaults.capped_limit(total)

        def per_cause(key: str, default: int) -> int:
            return check_int(d.get(key, default), f"requeue.{key}", 0, 10000)

        return cls(max_requeues=total,
                   signal=check_signal(d.get("signal", defaults.REQUEUE_SIGNAL),
                                       "requeue.signal"),
                   # Slurm's --signal lead time is at most 65535 s
                   signal_lead_s=check_int(d.get("signal_lead_s", 120), "requeue.signal_lead_s",
                                      0, 65535),
                   max_preemptions=per_cause("max_preemptions", total),
                   max_time_limits=per_cause("max_time_limits", total),
                   max_node_failures=per_cause("max_node_failures", capped),
                   max_crash_restarts=(per_cause("max_crash_restarts", 0)
                                       if "max_crash_restarts" in d else None),
                   max_storage_retries=per_cause("max_storage_retries", capped),
                   max_hangs=per_cause("max_hangs", capped))


@dataclass(frozen=True)
class WatchdogSpec:
    """The supervisor's hang watchdog and in-allocation restarts (docs/fault-recovery.md,
    "Hangs"). A timeout left out takes its default: with hpctrain.runtime, ten steps' time
    once the steps are timed (30..300 s; 300 s before) without a step
    (``hang_timeout_s``), 1800 s for start-up and for a save; a script that does not use
    the runtime is watched (by its output) only when ``hang_timeout_s`` is given. 0 turns a
    timeout off. ``collective_timeout_s`` bounds one collective of the training's process
    group (left out: the runtime's 600 s, long enough for a rank-0-only preparation at
    start-up while the others wait in a barrier).

    The timeouts nest: collective <= hang + COLLECTIVE_MARGIN_S (when given), hang < save.
    The watchdog (which dumps every rank's stacks) sees a hang first, or soon after the
    ranks waiting for the hung peer give up (when set shorter); a save may take longer
    than a step."""

    hang_timeout_s: int | None = None
    startup_timeout_s: int | None = None
    save_timeout_s: int | None = None
    collective_timeout_s: int | None = None
    # restarts inside the allocation, for the whole job (hpctrain.protocol.defaults)
    max_step_restarts: int = defaults.MAX_STEP_RESTARTS
    exclude_bad_nodes: bool = defaults.EXCLUDE_BAD_NODES  # requeue without a bad node

    @classmethod
    def from_dict(cls, data: Any) -> "WatchdogSpec":
        d = check_table(data, "watchdog", cls)
        timeouts = {key: check_opt_int(d.get(key), f"watchdog.{key}", 0)
                    for key in ("hang_timeout_s", "startup_timeout_s", "save_timeout_s")}
        exclude = d.get("exclude_bad_nodes", defaults.EXCLUDE_BAD_NODES)
        if not isinstance(exclude, bool):
            raise SpecError(f"watchdog.exclude_bad_nodes={exclude!r} must be true or false")
        spec = cls(**timeouts, exclude_bad_nodes=exclude,
                   collective_timeout_s=check_opt_int(d.get("collective_timeout_s"),
                                                 "watchdog.collective_timeout_s", 1),
                   max_step_restarts=check_int(d.get("max_step_restarts",
                                                     defaults.MAX_STEP_RESTARTS),
                                          "watchdog.max_step_restarts", 0, 1000))
        spec.check_order()
        return spec

    def check_order(self) -> None:
        """collective <= hang + COLLECTIVE_MARGIN_S, hang < save, for the timeouts that are
        on (a default counts)."""
        hang = DEFAULT_HANG_S if self.hang_timeout_s is None else self.hang_timeout_s
        save = DEFAULT_SAVE_S if self.save_timeout_s is None else self.save_timeout_s
        given = "" if self.hang_timeout_s is not None else " (its default)"
        top = hang + COLLECTIVE_MARGIN_S
        if self.collective_timeout_s is not None and hang and self.collective_timeout_s > top:
            raise SpecError(
                f"watchdog.collective_timeout_s={self.collective_timeout_s} is more than "
                f"{COLLECTIVE_MARGIN_S} s longer than watchdog.hang_timeout_s={hang}{given}: "
                "ranks would wait in a collective long after the hang was found; set "
                f"collective_timeout_s <= {top}, raise hang_timeout_s, or leave "
                "collective_timeout_s out (the runtime's 600 s, which also covers long "
                "start-up barriers)")
        if hang and save and hang >= save:
            said = "" if self.save_timeout_s is not None else " (its default)"
            raise SpecError(
                f"watchdog.hang_timeout_s={hang} is not shorter than "
                f"watchdog.save_timeout_s={save}{said}: a save must be allowed longer than "
                f"a step; set save_timeout_s to more than {hang}")


_SECTIONS = {"layout": LayoutSpec, "run": RunSpec, "checkpoint": CheckpointSpec,
             "requeue": RequeueSpec, "watchdog": WatchdogSpec, "container": ContainerSpec,
             "elastic": ElasticSpec, "health": HealthSpec, "resources": ResourceSpec,
             "model": ModelSpec}
_DIRECTIVE_FIELDS = ("account", "qos", "constraint", "exclude", "reservation", "output", "workdir")


@dataclass(frozen=True)
class JobSpec:
    """One training job as the researcher describes it (see docs/spec.md)."""

    name: str
    partition: str
    run: RunSpec
    nodes: int = 1
    gpus_per_node: int | None = None     # None: the partition's GPUs per node
    time: str = "01:00:00"
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    reservation: str | None = None
    mail: str | None = None
    mail_type: str = "END,FAIL"
    output: str | None = None            # None: hpctrain-%x-%j.out in the submit directory
    workdir: str | None = None
    layout: LayoutSpec = LayoutSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    requeue: RequeueSpec = RequeueSpec()
    watchdog: WatchdogSpec = WatchdogSpec()
    container: ContainerSpec | None = None   # run the step in a container (docs/containers.md)
    elastic: ElasticSpec = ElasticSpec()     # spare nodes for a lost one
    health: HealthSpec = HealthSpec()        # slow nodes: when one is, and what it gets
    resources: ResourceSpec = ResourceSpec()  # CPUs and memory (default: the GPUs' share)
    model: ModelSpec | None = None           # its parameter count: a step's FLOPs (report)
    sbatch: dict[str, str | None] = field(default_factory=dict, hash=False)

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobSpec":
        """Build and check a spec from a dict shaped like the TOML file."""
        d = check_table(data, "", cls)
        for key in ("name", "partition", "run"):
            if key not in d:
                raise SpecError(f"{key!r} is missing: every spec needs name, partition and "
                                "a [run] table with command")
        values: dict[str, Any] = {
            "name": check_name(d["name"], "name"),
            "partition": check_name(d["partition"], "partition"),
            "nodes": check_int(d.get("nodes", 1), "nodes", 1, 100000),
            "gpus_per_node": check_opt_int(d.get("gpus_per_node"), "gpus_per_node", 1),
            "time": d.get("time", "01:00:00"),
        }
        slurm_time_seconds(values["time"], "time")
        for key in _DIRECTIVE_FIELDS:
            if key in d:
                values[key] = check_directive_value(d[key], key)
        for key in ("account", "qos", "reservation"):
            if key in values:
                check_name(values[key], key)
        if "mail" in d:
            if not isinstance(d["mail"], str) or not MAIL_RE.match(d["mail"]):
                raise SpecError(f"mail={d['mail']!r} is not an e-mail address (user@host)")
            values["mail"] = d["mail"]
        values["mail_type"] = check_mail_type(d.get("mail_type", "END,FAIL"))
        for key, section in _SECTIONS.items():
            if key in d:
                values[key] = section.from_dict(d[key])
        sb = d.get("sbatch", {})
        if not isinstance(sb, Mapping):
            raise SpecError(f"sbatch={sb!r} must be a table of option = value")
        values["sbatch"] = dict(check_sbatch_option(k, v, "sbatch") for k, v in sb.items())
        return cls(**values)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "JobSpec":
        """Read a TOML spec file."""
        p = Path(path)
        data = read_toml(p)
        try:
            return cls.from_dict(data)
        except SpecError as exc:
            raise type(exc)(f"{p}: {exc}") from None

    def with_overrides(self, overrides: Mapping[str, Any]) -> "JobSpec":
        """A new spec with dotted keys replaced, e.g. ``{"layout.tp": 4, "nodes": 2}``."""
        data = self.to_dict()
        for key, value in overrides.items():
            _set_dotted(data, key, value)
        return JobSpec.from_dict(data)

    def replace(self, **changes: Any) -> "JobSpec":
        """dataclasses.replace, re-checked through from_dict."""
        return JobSpec.from_dict(replace(self, **changes).to_dict())

    # ---- output --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain dict (lists, no None) that :meth:`from_dict` turns back into this spec."""
        return _plain(self)

    def to_toml(self) -> str:
        """TOML text that :meth:`load` reads back into an equal spec."""
        from hpctrain.spec.tomlwriter import dumps
        return dumps(self.to_dict())

    @property
    def time_seconds(self) -> int | None:
        """The time limit in seconds; None when UNLIMITED."""
        return slurm_time_seconds(self.time)


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mount):
        return str(obj)
    if hasattr(obj, "__dataclass_fields__"):
        return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)
                if getattr(obj, f.name) is not None}
    if isinstance(obj, Mapping):
        return {k: (True if v is None else _plain(v)) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return [_plain(v) for v in obj]
    return obj


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if not all(parts):
        raise SpecError(f"--set {key!r}: use dotted keys like layout.tp=4 or nodes=2")
    top_known = [f.name for f in fields(JobSpec)]
    if parts[0] not in top_known:
        raise SpecError(f"unknown key {key!r}{closest(parts[0], top_known)}; valid keys: "
                        f"{', '.join(top_known)}")
    node = data
    for i, part in enumerate(parts[:-1]):
        section = _SECTIONS.get(parts[0]) if i == 0 else None
        if i == 0 and section is None and part != "sbatch":
            raise SpecError(f"--set {key!r}: {part!r} is a value, not a table")
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"--set {key!r}: {'.'.join(parts[:i + 1])!r} is not a table")
        node = child
    node[parts[-1]] = value

