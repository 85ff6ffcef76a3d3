"""Render a job spec to an sbatch script through the (site-layerable) Jinja templates.

Safety model, enforced here rather than trusted to each template:

- every ``{{ ... }}`` must produce a :class:`ShellSafe` string (the output of the
  ``shq``, ``directive`` or ``envname`` filters of :mod:`hpctrain.render.shell`, or the
  container words :mod:`hpctrain.render.container` builds from them) or an integer;
  anything else is refused with a TemplateError, so a template (built-in or a site's) cannot paste a
  raw user value into the script by forgetting a filter;
- ``shq`` quotes with :func:`shlex.quote`; ``directive`` only lets through values that
  need no quoting on an ``#SBATCH`` line; values that cannot be made safe (NUL, a
  newline on a directive line) are refused.

Rendering is pure: it reads templates and partition facts from the directories it
is given and nothing else (no environment, no subprocess, no file writes).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import jinja2
from jinja2.runtime import BlockReference, Context

from hpctrain import __version__, access, protocol
from hpctrain.protocol import nodemem
from hpctrain.protocol.defaults import SLOW_FACTOR, SLOW_FOR_S
from hpctrain.errors import HpctrainError, SpecError, TemplateError
from hpctrain.render.container import apptainer_env, container_setup, container_words
from hpctrain.render.shell import ShellSafe, directive, envname, shq
from hpctrain.spec.checks import DIRECTIVE_VALUE_RE
from hpctrain.spec.container import plan_container
from hpctrain.spec.launch import is_python, script_end
from hpctrain.spec.layout import LayoutPlan, plan_layout
from hpctrain.spec.model import JobSpec
from hpctrain.spec.partitions import Partition, find_partition
from hpctrain.spec.resources import Requests, plan_requests
from hpctrain.spec.site import devcluster_templates_dir, template_dirs as _search_path

BASE_TEMPLATE = "base.sbatch.j2"
DEFAULT_OUTPUT = "hpctrain-%x-%j.out"
# The interpreter that runs the job supervisor on the batch node when the caller names
# none; `hpctrain render`/`submit` name their own (sys.executable), as submitit does.
DEFAULT_PYTHON = "python3"
SUPERVISOR_MODULE = "hpctrain.supervisor"


def _finalize(value: Any) -> Any:
    if isinstance(value, ShellSafe) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TemplateError(f"a template prints {value!r} without a quoting filter: write "
                        "{{ value | shq }} (or | directive on #SBATCH lines)")


class _SafeBlock:
    """``{{ super() }}`` output: a block the templates already rendered safely."""

    def __init__(self, ref: BlockReference) -> None:
        self._ref = ref

    def __call__(self) -> ShellSafe:
        # without its final newline: `{{ super() }}` is written on a line of its own
        return ShellSafe(self._ref().rstrip("\n"))

    @property
    def super(self) -> Any:
        parent = self._ref.super
        return _SafeBlock(parent) if isinstance(parent, BlockReference) else parent


class _SafeContext(Context):
    def super(self, name: str, current: Any) -> Any:  # noqa: D102 - see _SafeBlock
        ref = super().super(name, current)
        return _SafeBlock(ref) if isinstance(ref, BlockReference) else ref


def environment(dirs: Sequence[Path],
                bytecode_cache: jinja2.BytecodeCache | None = None) -> jinja2.Environment:
    """The Jinja environment over ``dirs`` (first match wins): strict and shell-safe.

    Cached per search path so a sweep of 1000 points compiles each template once; Jinja's
    loader still notices an edited template file (auto_reload compares mtimes).
    ``bytecode_cache`` (the CLI passes one under the user's cache dir) keeps compiled
    templates between processes: compiling them is a third of a ``hpctrain render``.
    """
    return _environment(tuple(dirs), bytecode_cache)


@functools.lru_cache(maxsize=16)
def _environment(dirs: tuple[Path, ...],
                 bytecode_cache: jinja2.BytecodeCache | None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in dirs]),
        undefined=jinja2.StrictUndefined, autoescape=False, finalize=_finalize,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        bytecode_cache=bytecode_cache)
    env.context_class = _SafeContext
    env.filters.update(shq=shq, directive=directive, envname=envname)
    return env


@dataclass(frozen=True)
class Rendered:
    """A rendered script and what it was made from."""

    script: str
    spec: JobSpec
    plan: LayoutPlan
    partition: Partition
    requests: Requests       # the GPUs, CPUs and memory it asks for
    template: str            # template name, e.g. partitions/debug.sbatch.j2
    template_path: str       # the file it came from (shows site overrides)


def resolve_dirs(template_dirs: Iterable[str | Path] = (), devcluster: bool = True) -> list[Path]:
    """``template_dirs`` (checked to exist) followed by the built-in directory, then the
    devcluster's partitions when ``devcluster`` (the active Slurm is it); no env read."""
    dirs = _search_path(template_dirs, environ={})
    if devcluster:
        dirs.append(devcluster_templates_dir())
    unique = {d.resolve(): d for d in reversed(dirs)}  # keep each dir once, at its first place
    return [d for d in dirs if unique.pop(d.resolve(), None) is not None]


def render(spec: JobSpec, template_dirs: Iterable[str | Path] = (), *,
           python: str = DEFAULT_PYTHON,
           bytecode_cache: jinja2.BytecodeCache | None = None,
           snapshot: tuple[str, str] | None = None, partition: Partition | None = None,
           devcluster: bool = True) -> Rendered:
    """Plan ``spec`` on its partition and render it; raises SpecError/LayoutError/TemplateError.

    ``partition``: its facts as the caller found them (hpctrain.jobs.facts: site files over
    Slurm's own word); None: from the facts files on the search path alone. ``devcluster``:
    the devcluster's partitions and templates are on the search path (the active Slurm is
    the devcluster, or no Slurm is asked: tests, the reference scripts).

    ``python`` runs the job supervisor in the job: an interpreter that can import hpctrain
    on the compute nodes (the submitting one, on a cluster with shared home or software).
    ``bytecode_cache``: see :func:`environment`. ``snapshot`` is (id, directory) of the
    code snapshot the job runs (exported as HPCTRAIN_SNAPSHOT_ID/_DIR; the spec's
    workdir already points there)."""
    dirs = resolve_dirs(template_dirs, devcluster)
    if partition is None:
        partition = find_partition(spec.partition, dirs)
    plan = plan_layout(spec, partition)
    context = render_context(spec, plan, partition, python, snapshot)
    env = environment(dirs, bytecode_cache)
    name = f"partitions/{partition.name}.sbatch.j2"
    if not any((d / name).is_file() for d in dirs):
        name = BASE_TEMPLATE
    template = _get(env, name)
    try:
        script = template.render(context)
    except (HpctrainError, jinja2.TemplateError) as exc:
        raise TemplateError(f"{_where(exc, template)}: {exc}") from None
    return Rendered(script=script, spec=spec, plan=plan, partition=partition,
                    requests=context["requests"], template=name, template_path=str(template.filename))


def render_script(spec: JobSpec, template_dirs: Iterable[str | Path] = (), *,
                  python: str = DEFAULT_PYTHON) -> str:
    """The sbatch script for ``spec``: pure apart from reading templates and partition facts."""
    return render(spec, template_dirs, python=python).script


def _where(exc: BaseException, template: jinja2.Template) -> str:
    """file:line of the template line that failed (Jinja rewrites tracebacks to templates)."""
    if isinstance(exc, jinja2.TemplateSyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    where = str(template.filename)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(".j2"):
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def _get(env: jinja2.Environment, name: str) -> jinja2.Template:
    try:
        return env.get_template(name)
    except jinja2.TemplateNotFound:
        raise TemplateError(f"template {name!r} not found in {env.loader.searchpath}: "  # type: ignore[union-attr]
                            "reinstall hpctrain or fix --templates") from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"{exc.filename}:{exc.lineno}: {exc.message}") from None


# ---- what the templates see ------------------------------------------------------------
def render_context(spec: JobSpec, plan: LayoutPlan, partition: Partition,
                   python: str = DEFAULT_PYTHON,
                   snapshot: tuple[str, str] | None = None) -> dict[str, Any]:
    """The variables every template gets (documented in docs/templates.md)."""
    container = plan_container(spec.container, partition.container, partition.name,
                               launcher=plan.launcher,
                               checkpoint_dir=spec.checkpoint.dir, workdir=spec.workdir)
    requests = job_requests(spec, plan, partition)
    words = container_words(container)
    exports = job_exports(spec, plan) + health_check_exports(partition)
    if snapshot is not None:
        exports += [(protocol.SNAPSHOT_ID, snapshot[0]), (protocol.SNAPSHOT_DIR, snapshot[1])]
    if container is not None:  # the supervisor builds an OCI bundle from it
        exports.append((protocol.CONTAINER, json.dumps(container.to_json(), sort_keys=True)))
    return {
        "version": __version__,
        "spec": spec,
        "plan": plan,
        "partition": partition,
        "directives": sbatch_directives(spec, plan, partition, requests),
        "requests": requests,
        # what every srun that starts ranks says besides its size: srun does not inherit
        # the job's --cpus-per-task (Slurm 22.05-23.02), and block placement keeps the
        # ranks of a tensor-parallel group on one node whatever the site's default
        "srun_requests": ShellSafe(" ".join(srun_request_words(requests)) + " "),
        "exports": exports,
        "umask": f"{access.modes(spec.run.access).umask:03o}",
        # the container the launcher's tasks run in (render/container.py), else None
        "container": container,
        "container_words": words,
        # [run] local_rank_arg: how many words of the task's argv come before DeepSpeed's
        # --local_rank (the container's and the command's program), else None
        "local_rank_at": words.wrap_count + script_end(spec.run.command)
        if spec.run.local_rank_arg else None,
        "apptainer_env": apptainer_env(container),
        "container_setup": container_setup(container),
        "launcher_template": f"launchers/{plan.launcher}.j2",
        "supervisor": [python, "-m", SUPERVISOR_MODULE],
        # the batch step's stop signals: the time-limit warning (--signal=B:...) and TERM
        "stop_signals": list(dict.fromkeys((spec.requeue.signal, "TERM"))),
        "torchrun": torchrun_argv(spec.run.command) if plan.launcher == "torchrun" else None,
        # torchrun: the agent on the first node (SLURMD_NODENAME) hosts the rendezvous store;
        # not in Slurm's OCI containers, whose tasks all get the first task's variables (22.05)
        "rdzv_host_by_node": container is None or container.runtime != "oci",
        # the rendezvous port rule (protocol.master_port), in the script's own arithmetic
        "port_base": protocol.PORT_BASE,
        "port_span": protocol.PORT_SPAN,
    }


def sbatch_directives(spec: JobSpec, plan: LayoutPlan, partition: Partition,
                      requests: Requests | None = None) -> list[tuple[str, str | None]]:
    """``#SBATCH`` options as (option, value or None for a flag), in script order;
    ``requests``: the job's (:func:`job_requests`), when the caller has them already."""
    requests = requests or job_requests(spec, plan, partition)
    opts: list[tuple[str, str | None]] = [
        ("job-name", spec.name), ("partition", spec.partition),
        ("nodes", str(plan.job_nodes)), ("ntasks-per-node", str(plan.tasks_per_node)),
        *requests.directives(), ("time", spec.time)]
    for key, default in (("account", partition.default_account), ("qos", partition.default_qos),
                         ("constraint", partition.default_constraint),
                         ("exclude", ""), ("reservation", "")):
        value = getattr(spec, key) or default
        if value:
            opts.append((key, value))
    if spec.mail:
        opts += [("mail-user", spec.mail), ("mail-type", spec.mail_type)]
    if spec.workdir:
        opts.append(("chdir", spec.workdir))
    opts += [("output", spec.output or DEFAULT_OUTPUT), ("open-mode", "append"),
             ("requeue", None),
             ("signal", f"B:{spec.requeue.signal}@{spec.requeue.signal_lead_s}")]
    opts += list(spec.sbatch.items())
    for key, value in opts:
        if value is not None and not DIRECTIVE_VALUE_RE.match(value):
            raise SpecError(f"--{key}={value!r} cannot go on an #SBATCH line: fix the "
                            "spec or the partition's defaults (no spaces, quotes or $)")
    return opts


def job_requests(spec: JobSpec, plan: LayoutPlan, partition: Partition) -> Requests:
    """The job's GPU, CPU and memory requests (hpctrain.spec.resources)."""
    if partition.gpu_request not in ("gres", "gpus-per-node"):
        raise TemplateError(f"{partition.source}: gpu_request={partition.gpu_request!r}: "
                            "use \"gpus-per-node\" or \"gres\"")
    return plan_requests(spec.resources, spec.sbatch, partition=partition,
                         gpus_per_node=plan.gpus_per_node, tasks_per_node=plan.tasks_per_node)


def srun_request_words(requests: Requests) -> list[str]:
    """The options of the srun that starts the ranks, besides its size."""
    cpus = [f"--cpus-per-task={requests.cpus_per_task}"] if requests.cpus_per_task else []
    return [*cpus, "--distribution=block"]


def job_exports(spec: JobSpec, plan: LayoutPlan) -> list[tuple[str, str]]:
    """HPCTRAIN_* variables every rank sees (names documented in docs/spec.md)."""
    ck, rq = spec.checkpoint, spec.requeue
    pairs = [
        (protocol.JOB_NAME, spec.name), (protocol.PARTITION, spec.partition),
        (protocol.LAUNCHER, plan.launcher), (protocol.NODES, plan.nodes),
        (protocol.GPUS_PER_NODE, plan.gpus_per_node), (protocol.WORLD_SIZE, plan.world),
        (protocol.TP, plan.tp), (protocol.PP, plan.pp), (protocol.DP, plan.dp),
        (protocol.CKPT_INTERVAL_STEPS, ck.interval_steps),
        (protocol.CKPT_KEEP_LAST, ck.keep_last),
        # the supervisor's settings (hpctrain.supervisor.config reads them)
        (protocol.MAX_REQUEUES, rq.max_requeues),
        (protocol.MAX_PREEMPTIONS, rq.max_preemptions),
        (protocol.MAX_TIME_LIMITS, rq.max_time_limits),
        (protocol.MAX_NODE_FAILURES, rq.max_node_failures),
        (protocol.MAX_STORAGE_RETRIES, rq.max_storage_retries),
        (protocol.MAX_HANGS, rq.max_hangs),
        (protocol.REQUEUE_SIGNAL, rq.signal),
        (protocol.SIGNAL_LEAD_S, rq.signal_lead_s),
        (protocol.TIME_LIMIT_S, plan.time_s if plan.time_s is not None else 0),
    ]
    wd = spec.watchdog
    pairs += [(protocol.MAX_STEP_RESTARTS, wd.max_step_restarts),
              (protocol.EXCLUDE_BAD_NODES, int(wd.exclude_bad_nodes))]
    pairs += [(name, value) for name, value in (
        # left out: the supervisor's default, which depends on the script (runtime.run)
        (protocol.MAX_CRASH_RESTARTS, rq.max_crash_restarts),
        (protocol.HANG_TIMEOUT_S, wd.hang_timeout_s),
        (protocol.STARTUP_TIMEOUT_S, wd.startup_timeout_s),
        (protocol.SAVE_TIMEOUT_S, wd.save_timeout_s),
        (protocol.COLLECTIVE_TIMEOUT_S, wd.collective_timeout_s)) if value is not None]
    if plan.spare_nodes:
        pairs.append((protocol.SPARE_NODES, plan.spare_nodes))
    if plan.min_nodes is not None and plan.min_nodes < plan.nodes:
        pairs.append((protocol.MIN_NODES, plan.min_nodes))
    health = spec.health      # each said only when the spec gives it (the defaults agree)
    pairs += [(name, value) for name, value, default in (
        (protocol.ON_SLOW, health.on_slow, None),
        (protocol.SLOW_FACTOR, f"{health.slow_factor:g}", f"{SLOW_FACTOR:g}"),
        (protocol.SLOW_FOR_S, f"{health.slow_for_s:g}", f"{SLOW_FOR_S:g}"),
        (protocol.PREFLIGHT, int(health.preflight), 0)) if value != default]
    if plan.peer_copies:
        pairs.append((nodemem.PEER_COPIES, 1))
    if ck.dir is not None:
        pairs.append((protocol.CKPT_DIR, ck.dir))
    if ck.access != "private":  # the manager's default; said only when it differs
        pairs.append((protocol.CKPT_ACCESS, ck.access))
    if ck.keep_every is not None:
        pairs.append((protocol.CKPT_KEEP_EVERY, ck.keep_every))
    if ck.stripe_count is not None:
        pairs.append((protocol.CKPT_STRIPE_COUNT, ck.stripe_count))
    if spec.model is not None:   # a step's FLOPs for report's MFU (hpctrain.runtime.work)
        pairs += [(protocol.MODEL_PARAMS, f"{spec.model.params:g}"),
                  (protocol.MODEL_MODE, spec.model.mode)]
    return [(k, str(v)) for k, v in pairs]


def health_check_exports(partition: Partition) -> list[tuple[str, str]]:
    """The partition's node check for the supervisor (none: nothing exported)."""
    if not partition.health_check:
        return []
    return [(protocol.HEALTH_CHECK, json.dumps(list(partition.health_check))),
            (protocol.HEALTH_CHECK_TIMEOUT_S, str(partition.health_check_timeout_s))]


def torchrun_argv(command: Sequence[str]) -> dict[str, list[str]]:
    """How torchrun starts ``command``: {"launcher": [...], "script": [...]}.

    ``python[3] script.py ...`` runs torchrun as ``python -m torch.distributed.run`` with
    that very interpreter (no PATH lookup); any other program runs through
    ``torchrun --no-python``.
    """
    if is_python(command):
        if len(command) < 2:
            raise SpecError(f"run.command={list(command)!r} starts python without a script: "
                            "add the training script (or -m module) for torchrun")
        return {"launcher": [command[0], "-m", "torch.distributed.run"],
                "script": list(command[1:])}
    return {"launcher": ["torchrun"], "script": ["--no-python", *command]}
