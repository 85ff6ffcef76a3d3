"""Submitting: a spec, a Python callable or a sweep becomes rendered scripts handed to
submitit, an entry in the local index, and :class:`~hpctrain.jobs.handle.Job` handles.

Every path renders the job through :mod:`hpctrain.render` and submits the rendered script
through :class:`hpctrain.jobs.executor.RenderedExecutor` (submitit). Importing this module is
cheap; submitit is imported when something is submitted.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from hpctrain.access import modes as access_modes
from hpctrain.errors import SlurmError, SpecError
from hpctrain.files import atomic_write
from hpctrain.jobs import index
from hpctrain.jobs.handle import Job, log_paths
from hpctrain.jobs.index import JobEntry
from hpctrain.jobs.paths import job_folder
from hpctrain.jobs.precheck import precheck
from hpctrain.jobs.provenance import Provenance, provenance, write_provenance
from hpctrain.jobs.snapshot import Origin, materialize, snapshot_dir
from hpctrain.jobs.sweep import (differing_directives, dispatcher_script, grid_points, index_width,
                                 plan_arrays, task_checkpoint_dir)
from hpctrain.runtime.function import CheckpointableRankCall, RankCall
from hpctrain.spec.layout import LayoutPlan
from hpctrain.spec.model import JobSpec, LayoutSpec
from hpctrain.spec.overrides import parse_set_options

Templates = Sequence[str | os.PathLike[str]]


def prepare(spec: JobSpec, templates: Templates = (), python: str | None = None,
            snapshot: tuple[str, str] | None = None) -> tuple[str, LayoutPlan]:
    """Check the spec against its partition and render it: (script, layout plan).

    ``templates`` are layered over $HPCTRAIN_TEMPLATES and the built-in set, as on the CLI;
    ``python`` runs the job's supervisor (default: this interpreter, as submitit does);
    ``snapshot`` is the (id, directory) of the code snapshot the job runs.
    """
    from hpctrain.jobs.facts import render_here
    from hpctrain.spec.site import template_dirs

    rendered = render_here(spec, template_dirs(templates), python=python or sys.executable,
                           snapshot=snapshot)
    return rendered.script, rendered.plan



@dataclass(frozen=True)
class Frozen:
    """A submission's code: the spec as it runs, its snapshot (id, dir) and provenance."""

    spec: JobSpec
    snapshot: tuple[str, str] | None
    provenance: Provenance | None      # None for a dry run

    def record(self) -> dict[str, str]:
        """What the job index keeps of it."""
        return {"snapshot": self.snapshot[0], "snapshot_dir": self.snapshot[1]} \
            if self.snapshot else {}


def freeze(spec: JobSpec, folder: str | os.PathLike[str], origin: Origin | None = None, *,
           default: bool = False, write: bool = True) -> Frozen:
    """Snapshot the code of ``spec`` into ``folder`` when ``[run] snapshot`` (else
    ``default``) asks for it, and run the job from there: its working directory is the copy,
    and its log goes into the job folder (a relative ``output`` is taken from there).
    ``write=False`` names the snapshot without copying (``--dry-run``)."""
    origin = origin or Origin(spec.workdir or os.getcwd())
    wanted = spec.run.snapshot if spec.run.snapshot is not None else default
    if not wanted:
        return Frozen(spec, None, provenance(
            None, None, source_dir=origin.dir, git=origin.git,
            submitted_from=origin.submitted_from) if write else None)
    output = os.path.join(folder, spec.output or "hpctrain-%x-%j.out")
    if not write and origin.known_id:
        where = snapshot_dir(folder, origin.known_id)
        return Frozen(spec.replace(workdir=str(where), output=output),
                      (origin.known_id, str(where)), None)
    source = origin.scan()
    if not write:
        where = snapshot_dir(folder, source.id)
        prov = None
    else:
        where = materialize(source, folder, spec.run.access)
        prov = provenance(source, where, submitted_from=origin.submitted_from)
    return Frozen(spec.replace(workdir=str(where), output=output), (source.id, str(where)), prov)


def _write_provenance(folder: str | os.PathLike[str], key: str, frozen: Frozen,
                      access_level: str) -> dict[str, str]:
    """Record the provenance beside the rendered script; the job is queued by now, so a
    failure to write (a full disk) is noted in the index rather than raised."""
    if frozen.provenance is None:
        return {}
    try:
        write_provenance(folder, key, frozen.provenance, access_level)
    except OSError as exc:
        return {"provenance_error": f"{exc.strerror or exc}"}
    return {}


def check_passthrough(spec: JobSpec, environ: Mapping[str, str] | None = None) -> None:
    """Every ``run.env_passthrough`` name must be set where the job is submitted: sbatch
    hands this environment to the job (and Slurm keeps it for requeues), so the value
    reaches the ranks without being written into the script or the job folder."""
    environ = os.environ if environ is None else environ
    missing = [n for n in spec.run.env_passthrough if n not in environ]
    if missing:
        raise SpecError(f"run.env_passthrough names {', '.join(missing)}, which "
                        f"{'is' if len(missing) == 1 else 'are'} not set here: export "
                        f"{missing[0]}=... in the shell you submit from (the value travels "
                        "with the job through Slurm and is never written to a file)")


def _minutes(spec: JobSpec) -> int:
    seconds = spec.time_seconds
    return 60 * 24 * 365 if seconds is None else max(1, seconds // 60)


def submit(spec: JobSpec, *, folder: str | os.PathLike[str] | None = None,
           templates: Templates = (), spec_path: str = "", origin: Origin | None = None,
           snapshot_default: bool = False) -> Job:
    """Render ``spec`` and submit it; the file Slurm runs is exactly ``hpctrain render``'s
    output (for the spec as it runs: from its snapshot, see :func:`freeze`)."""
    from hpctrain.jobs.executor import RenderedExecutor, prepare_folder

    check_passthrough(spec)
    precheck(spec)
    jfolder = job_folder(spec.name, folder)
    prepare_folder(jfolder, access_modes(spec.run.access).dir)
    frozen = freeze(spec, jfolder, origin, default=snapshot_default)
    script, plan = prepare(frozen.spec, templates, snapshot=frozen.snapshot)
    executor = RenderedExecutor(jfolder, script, plan.ntasks, time_min=_minutes(spec),
                                access_level=spec.run.access)
    sjob = executor.submit_script()
    extra = {**frozen.record(),
             **_write_provenance(jfolder, sjob.job_id, frozen, spec.run.access)}
    logs = log_paths(script, os.getcwd())
    rec = JobEntry(job_id=sjob.job_id, name=spec.name, kind="script", folder=str(jfolder),
                    log=logs.log, rank_log=logs.rank_log,
                    checkpoint_dir=spec.checkpoint.dir or "", partition=spec.partition,
                    num_tasks=plan.ntasks, spec=spec_path,
                    # $SLURM_SUBMIT_DIR: where a job without a checkpoint dir leaves its exit record
                    extra={"submit_dir": os.getcwd(), **extra})
    index.append([rec])
    return Job(rec, submitit_job=sjob)


def submit_function(fn: Callable[..., Any], *args: Any, partition: str = "debug",
                    nodes: int = 1, gpus_per_node: int | None = None,
                    layout: LayoutSpec | Mapping[str, int] | None = None,
                    name: str | None = None, time: str = "01:00:00",
                    folder: str | os.PathLike[str] | None = None,
                    setup: Sequence[str] = (), env: Mapping[str, str] | None = None,
                    account: str | None = None, templates: Templates = (),
                    max_num_timeout: int = 3, python: str | None = None,
                    env_passthrough: Sequence[str] = (), access: str = "private",
                    snapshot: bool = False, origin: Origin | None = None,
                    **kwargs: Any) -> Job:
    """Run ``fn(*args, **kwargs)`` on every rank of an allocation (one task per GPU).

    The job is an ordinary hpctrain spec with the ``srun`` launcher whose command is
    submitit's entry point, rendered by the partition's templates. Each rank sees
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and HPCTRAIN_{TP,DP,PP}[_RANK].
    A callable with a ``checkpoint`` method (submitit.helpers.Checkpointable) is
    checkpointed and requeued by submitit on the preemption/time-limit signal.
    ``job.result()`` returns one value per rank when there is more than one.
    ``env_passthrough`` and ``access`` are the spec's ``[run]`` keys of those names
    (docs/security.md): secrets by name from this environment, and who may read the
    job folder (its pickles hold ``args`` and ``kwargs``). ``snapshot=True`` copies the
    current directory (``origin``) into the job folder and runs there, so the modules the
    callable imports are the ones of submission time on every requeue.
    """
    from hpctrain.jobs.executor import RenderedExecutor, prepare_folder, submitit_command

    job_name = name or function_job_name(fn)
    jfolder = job_folder(job_name, folder)
    python = python or sys.executable
    lay = _layout_dict(layout)
    data: dict[str, Any] = {
        "name": job_name, "partition": partition, "nodes": nodes, "time": time,
        "output": f"{jfolder}/%j_log.out", "layout": lay,
        # submitit's own budget for time-limit requeues, kept by the supervisor too
        "requeue": {"max_time_limits": max_num_timeout},
        "run": {"launcher": "srun", "command": submitit_command(python, jfolder),
                "setup": list(setup), "env": {"SUBMITIT_EXECUTOR": "slurm", **(env or {})},
                "env_passthrough": list(env_passthrough), "access": access,
                "snapshot": snapshot},
    }
    if gpus_per_node is not None:
        data["gpus_per_node"] = gpus_per_node
    if account:
        data["account"] = account
    spec = JobSpec.from_dict(data)
    check_passthrough(spec)
    prepare_folder(jfolder, access_modes(access).dir)
    frozen = freeze(spec, jfolder, origin)
    script, plan = prepare(frozen.spec, templates, python, snapshot=frozen.snapshot)
    executor = RenderedExecutor(jfolder, script, plan.ntasks, time_min=_minutes(spec),
                                max_num_timeout=max_num_timeout, python=python,
                                access_level=access)
    call_cls = CheckpointableRankCall if hasattr(fn, "checkpoint") else RankCall
    sjob = executor.submit(call_cls(fn, {"tp": plan.tp, "pp": plan.pp}), *args, **kwargs)
    extra = {**frozen.record(), **_write_provenance(jfolder, sjob.job_id, frozen, access)}
    logs = log_paths(script, os.getcwd())
    rec = JobEntry(job_id=sjob.job_id, name=job_name, kind="function", folder=str(jfolder),
                    log=logs.log, rank_log=f"{jfolder}/%j_%t_log.out", partition=partition,
                    num_tasks=plan.ntasks, extra={"submit_dir": os.getcwd(), **extra})
    index.append([rec])
    return Job(rec, submitit_job=sjob)


def function_job_name(fn: Callable[..., Any]) -> str:
    """A Slurm-safe job name from a callable's name (``_train`` -> ``train``, lambdas -> ``lambda``)."""
    raw = getattr(fn, "__name__", None) or type(fn).__name__
    cleaned = re.sub(r"[^A-Za-z0-9._+-]+", "-", raw).lstrip("._+-")[:128]
    return cleaned or "function"


def _layout_dict(layout: LayoutSpec | Mapping[str, int] | None) -> dict[str, int]:
    if layout is None:
        return {}
    if isinstance(layout, Mapping):
        return {k: int(v) for k, v in layout.items()}
    return {k: v for k in ("tp", "pp", "dp", "num_layers", "num_heads")
            if (v := getattr(layout, k, None)) is not None}


# ---- sweeps --------------------------------------------------------------------------------
@dataclass
class Sweep:
    """A submitted sweep: its id (the first array's job id), arrays, and per-task handles."""

    sweep_id: str
    arrays: list[JobEntry]
    points: list[dict[str, str]] = field(default_factory=list)

    @property
    def jobs(self) -> list[Job]:
        return [Job(rec, task=str(t)) for rec in self.arrays for t in range(rec.num_tasks)]


def sweep_specs(spec: JobSpec, grid: Mapping[str, Sequence[str]]) -> tuple[list[dict[str, str]], list[JobSpec]]:
    """The grid's points and one spec per point (own overrides, own checkpoint subdir). Pure."""
    points = grid_points({k: list(v) for k, v in grid.items()})
    width = index_width(len(points))
    specs = []
    for i, point in enumerate(points):
        overrides = parse_set_options([f"{k}={v}" for k, v in point.items()])
        if spec.checkpoint.dir:
            overrides["checkpoint.dir"] = task_checkpoint_dir(spec.checkpoint.dir, i, width)
        specs.append(spec.with_overrides(overrides))
    return points, specs


def render_sweep(spec: JobSpec, grid: Mapping[str, Sequence[str]], templates: Templates = (),
                 snapshot: tuple[str, str] | None = None
                 ) -> tuple[list[dict[str, str]], list[JobSpec], list[tuple[str, LayoutPlan]],
                            list[list[str]]]:
    """Points, specs, rendered scripts and their headers; refuses grids that change resources."""
    from hpctrain.slurm.parse import sbatch_header

    points, specs = sweep_specs(spec, grid)
    rendered = [prepare(s, templates, snapshot=snapshot) for s in specs]
    headers = [sbatch_header(script) for script, _ in rendered]
    diff = differing_directives(headers)
    if diff:
        raise SpecError(f"the grid changes Slurm directives ({'; '.join(diff[:4])}), but every "
                        f"task of a job array gets the same allocation: sweep only keys that "
                        f"do not change resources (grid keys: {', '.join(grid)}), or submit "
                        "those as separate jobs")
    return points, specs, rendered, headers


def submit_sweep(spec: JobSpec, grid: Mapping[str, Sequence[str]], *,
                 max_parallel: int | None = None, folder: str | os.PathLike[str] | None = None,
                 templates: Templates = (), spec_path: str = "",
                 array_limit: int | None = None, origin: Origin | None = None,
                 snapshot_default: bool = False) -> Sweep:
    """Submit the grid's cartesian product as ONE job array (split above MaxArraySize).

    Each point's script is rendered like ``hpctrain render --set k=v ...`` would; the
    array's script is their common ``#SBATCH`` header plus one line that runs the
    point of ``$SLURM_ARRAY_TASK_ID``.
    """
    from hpctrain.jobs.executor import RenderedExecutor, prepare_folder
    from hpctrain.slurm import control

    check_passthrough(spec)
    precheck(spec)
    modes = access_modes(spec.run.access)
    name_dir = job_folder(spec.name, folder)
    prepare_folder(name_dir, modes.dir)
    # one snapshot for every point, beside the sweep folders of this name
    frozen = freeze(spec, name_dir, origin, default=snapshot_default)
    points, specs, rendered, headers = render_sweep(frozen.spec, grid, templates,
                                                    frozen.snapshot)
    chunks = plan_arrays(len(points), max_parallel, array_limit or control.max_array_size())
    sweep_dir = name_dir / f"sweep-{uuid.uuid4().hex[:8]}"
    prepare_folder(sweep_dir, modes.dir)
    for i, (script, _) in enumerate(rendered):
        atomic_write(sweep_dir / f"point-{i}.sh", script, mode=modes.file)
    logs = log_paths(rendered[0][0], os.getcwd(), array=True)
    arrays: list[JobEntry] = []
    sweep_id = ""
    for chunk in chunks:
        args = [f"--array={chunk.array_option}"]
        if chunk.after is not None:
            args.append(f"--dependency=afterany:{arrays[chunk.after].job_id}")
        text = dispatcher_script(headers[0], str(sweep_dir), chunk.offset)
        executor = RenderedExecutor(sweep_dir, text, rendered[0][1].ntasks, sbatch_args=args,
                                    time_min=_minutes(spec), access_level=spec.run.access)
        try:
            sjob = executor.submit_script()
        except SlurmError as exc:
            if not arrays:
                raise
            index.append(arrays)   # keep what was queued visible: record it before failing
            queued = chunk.offset
            raise SlurmError(f"{exc}. The sweep is queued in part: points 0-{queued - 1} as "
                             f"sweep {sweep_id} ({len(arrays)} arrays); points {queued}-"
                             f"{len(points) - 1} are not. `hpctrain cancel {sweep_id}` and "
                             "submit it again, or keep it and sweep the rest") from None
        sweep_id = sweep_id or sjob.job_id
        arrays.append(JobEntry(
            job_id=sjob.job_id, name=spec.name, kind="sweep", folder=str(sweep_dir),
            log=logs.log, checkpoint_dir=spec.checkpoint.dir or "", partition=spec.partition,
            num_tasks=chunk.size, spec=spec_path, sweep_id=sweep_id, sweep_offset=chunk.offset,
            points=points[chunk.offset:chunk.offset + chunk.size],
            extra={"max_parallel": max_parallel, "array": chunk.array_option,
                   "total_points": len(points), **frozen.record()}))
    arrays[0].extra.update(_write_provenance(sweep_dir, sweep_id, frozen, spec.run.access))
    index.append(arrays)
    return Sweep(sweep_id, arrays, points)
