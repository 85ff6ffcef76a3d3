"""``hpctrain _serve ...``: the cluster's side of ``--host`` (hidden; run over ssh only).

The client (``hpctrain.remote``) copies the code snapshot with rsync, then runs one of
these with a JSON request on stdin. Each does what the same command does on the login
node, through the same functions, so a remote job is recorded in the cluster's job index
and behaves like any other: the cluster stays the one place that knows its jobs.

- ``submit``: a spec, a sweep or a pickled callable (the request's ``kind``); the staged
  copy of the client's tree becomes the job's snapshot (checked against the client's id)
  and is removed from the staging area once copied;
- ``info JOB_ID`` / ``wait JOB_ID``: the job's state as JSON (``wait``: one line per change,
  until the job has ended for good);
- ``result JOB_ID``: a function job's result files, base64, for the client to unpickle;
- ``daemon --name N``: start the warm server that runs the short commands (status, logs,
  cancel, report, info, result) without a Python start each (:mod:`hpctrain.remote.server`).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from hpctrain.errors import HpctrainError, JobError

# where clients stage snapshots, relative to the home directory (hpctrain.remote.client)
STAGING = ".cache/hpctrain/staging"
_STAGED = re.compile(r"^\.cache/hpctrain/staging/[0-9a-f]{12}$")


@click.group(name="_serve", hidden=True)
def serve() -> None:
    """The cluster side of `hpctrain --host` (run by the client over ssh)."""


def _request() -> dict[str, Any]:
    try:
        data = json.load(sys.stdin)
    except ValueError as exc:
        raise HpctrainError(f"_serve: the request on stdin is not JSON ({exc}): this "
                            "command is run by `hpctrain --host`, not by hand") from None
    if not isinstance(data, dict):
        raise HpctrainError("_serve: the request must be a JSON object")
    return data


def _origin(req: dict[str, Any]) -> tuple[Any, Path | None]:
    """Where the client's code is here (its staged copy), and that copy's directory."""
    from hpctrain.jobs.snapshot import Origin

    snap = req.get("snapshot")
    if not snap:
        return Origin(os.getcwd(), git=req.get("git") or {},
                      submitted_from=req.get("submitted_from", "")), None
    if snap.get("dir") is None:   # a dry run: the client named its snapshot, sent no code
        if not req.get("dry_run"):
            raise HpctrainError("_serve: a request without staged code must be a dry run")
        return Origin(os.getcwd(), git=snap.get("git") or {}, known_id=str(snap["id"]),
                      submitted_from=req.get("submitted_from", "")), None
    rel = str(snap["dir"])
    if not _STAGED.match(rel):
        raise HpctrainError(f"_serve: staging dir {rel!r} is not under ~/{STAGING}")
    staged = Path.home() / rel
    _keep_private(Path.home() / STAGING)
    return Origin(str(staged), git=snap.get("git") or {}, expect_id=str(snap["id"]),
                  submitted_from=req.get("submitted_from", ""),
                  files=tuple(snap["files"])), staged


def _keep_private(staging: Path) -> None:
    """The staging directory lists every snapshot id sent: the client's rsync makes it
    0700 (umask 077), and one an older client left open is closed here."""
    try:
        st = staging.stat()
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(staging, 0o700)
    except OSError:
        pass   # the staged copy's own checks below say what is wrong


def _passthrough(req: dict[str, Any]) -> None:
    # values of [run] env_passthrough, sent over ssh from the client's environment: sbatch
    # hands them to the job from this process's environment, never from a file
    for name, value in (req.get("passthrough") or {}).items():
        os.environ[str(name)] = str(value)


@serve.command()
def submit() -> int:
    """Submit the spec, sweep or callable of the request on stdin."""
    from hpctrain.spec.model import JobSpec
    from hpctrain.spec.site import template_dirs

    req = _request()
    origin, staged = _origin(req)
    _passthrough(req)
    kind = req.get("kind", "submit")
    try:
        if kind == "function":
            return _submit_function(req, origin)
        spec = JobSpec.from_dict(req["spec"])
        templates = template_dirs(str(d) for d in req.get("templates") or ())
        if kind == "sweep":
            from hpctrain.commands.sweep import run_sweep
            return run_sweep(spec, req["grid"], max_parallel=req.get("max_parallel"),
                             template_dirs=templates, folder=req.get("folder"),
                             dry_run=bool(req.get("dry_run")), as_json=bool(req.get("json")),
                             spec_path="", origin=origin, snapshot_default=True)
        from hpctrain.commands.submit import run_submit
        return run_submit(spec, spec_path="", template_dirs=templates, folder=req.get("folder"),
                          dry_run=bool(req.get("dry_run")), wait=bool(req.get("wait")),
                          as_json=bool(req.get("json")), origin=origin, snapshot_default=True)
    finally:
        if staged is not None and not req.get("dry_run"):
            shutil.rmtree(staged, ignore_errors=True)   # the job folder has its own copy now


def _submit_function(req: dict[str, Any], origin: Any) -> int:
    import cloudpickle

    from hpctrain.commands.jobview import job_json
    from hpctrain.jobs.submit import submit_function

    fn_data = req["function"]
    # a callable pickled by reference imports its module from the client's tree
    sys.path.insert(0, origin.dir)
    fn, args, kwargs = cloudpickle.loads(base64.b64decode(fn_data["pickle"]))
    options = dict(fn_data.get("options") or {})
    snapshot = options.pop("snapshot", True)
    job = submit_function(fn, *args, **options, snapshot=snapshot, origin=origin, **kwargs)
    click.echo(json.dumps(job_json(job, state="SUBMITTED", log=str(job.log_path()),
                                   snapshot=job.entry.extra.get("snapshot", ""))))
    return 0


def _job(job_id: str) -> Any:
    from hpctrain.jobs.handle import Job
    return Job.attach(job_id)


def _info_line(job: Any, info: Any, over: bool) -> dict[str, Any]:
    """What the client's :class:`~hpctrain.remote.client.RemoteJob` reads: the job, its
    state, and whether it has ended for good."""
    from hpctrain.jobs.view import info_json

    return {"job_id": job.job_id, "name": job.name, "kind": job.entry.kind,
            "folder": job.folder, "log": str(job.log_path()), "over": over,
            **info_json(info)}


@serve.command()
@click.argument("job_id")
def info(job_id: str) -> int:
    """One JSON line: the job's state, and whether it has ended for good."""
    job = _job(job_id)
    now = job.info()
    click.echo(json.dumps(_info_line(job, now, job.over(now))))
    return 0


@serve.command()
@click.argument("job_id")
@click.option("--poll", "poll_s", type=float, default=2.0)
def wait(job_id: str, poll_s: float) -> int:
    """A JSON line whenever the job's state changes, until it has ended for good (or
    the client has gone: a Ctrl-C during ``RemoteJob.wait``)."""
    from hpctrain.commands.reader import reader_gone, wait_while_read

    job, last = _job(job_id), ""
    try:
        for now, over in job.updates(max(poll_s, 0.5), idle=wait_while_read):
            text = json.dumps(_info_line(job, now, over))
            if text != last:
                click.echo(text)
                last = text
        return 0
    except BrokenPipeError:
        return reader_gone()


@serve.command()
@click.argument("job_id")
def result(job_id: str) -> int:
    """A function job's result files (submitit's pickles), base64, one per rank."""
    from hpctrain.jobs.results import read_result_files

    job = _job(job_id)
    if job.entry.kind != "function":
        raise JobError(f"job {job_id} runs a script, not a Python callable: it has no result")
    files = [None if blob is None else base64.b64encode(blob).decode()
             for blob in read_result_files(job.folder, job.entry.job_id, job.entry.num_tasks)]
    click.echo(json.dumps({"job_id": job_id, "results": files,
                           "state": str(job.state)}))
    return 0


@serve.command()
@click.option("--name", required=True, help="The client's server name (16 hex digits).")
@click.option("--idle", "idle_s", type=float, default=600.0,
              help="End after this many seconds without a request.")
def daemon(name: str, idle_s: float) -> int:
    """Start (or find) the warm server ``name``; one JSON line: its socket's path."""
    from hpctrain.remote.server import start

    click.echo(json.dumps(start(name, idle_s)))
    return 0
