"""The client side of ``--host``: stage the code, ask the cluster's hpctrain, hand back jobs.

Every command is one ssh round trip over the shared connection (plus one rsync when a
snapshot is sent). The cluster's hpctrain does the work (``hpctrain _serve``, or the
ordinary command for status, logs and cancel; the short calls through its warm server,
:mod:`hpctrain.remote.warm`), so a job submitted from a laptop is in the cluster's job
index like any other, and ``status`` on the login node shows it too.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import socket
from typing import Any, Callable, Iterator, Mapping, Sequence

from hpctrain.errors import JobError, RemoteError, SpecError
from hpctrain.jobs.contract import POLL_S, JobHandle, Update
from hpctrain.jobs.poll import JobInfo
from hpctrain.jobs.results import decode_results
from hpctrain.jobs.view import info_from_json
from hpctrain.remote.ssh import Connection, Target

STAGING = ".cache/hpctrain/staging"   # hpctrain.commands.serve.STAGING, on the cluster


def stage(conn: Connection, spec_snapshot: bool | None, *, source_dir: str | None = None,
          workdir: str | None = None, default: bool = True, send: bool = True
          ) -> dict[str, Any]:
    """Send the code of ``source_dir`` (default: here) when a snapshot is wanted; the
    request fields that tell the cluster where it is and where it came from. ``send=False``
    (a dry run): the snapshot is only named (its id), nothing is copied."""
    from hpctrain.jobs.snapshot import git_facts, scan

    source_dir = os.path.abspath(source_dir or os.getcwd())
    here = f"{getpass.getuser()}@{socket.gethostname()}:{source_dir}"
    wanted = spec_snapshot if spec_snapshot is not None else default
    if not wanted:
        from pathlib import Path
        git = git_facts(Path(source_dir))
        git.pop("files", None)
        return {"snapshot": None, "git": git, "submitted_from": here}
    if workdir:
        raise SpecError(f"workdir={workdir!r} names a directory on the cluster, but the "
                        f"snapshot sends this machine's {source_dir}: leave workdir out (the "
                        "job runs in its snapshot) or set [run] snapshot = false")
    source = scan(source_dir)
    git = {k: v for k, v in source.git.items() if k != "files"}
    if not send:
        return {"snapshot": {"dir": None, "id": source.id, "git": git},
                "submitted_from": here}
    dest = f"{STAGING}/{source.id}"
    conn.rsync(source.root, source.paths, dest)
    return {"snapshot": {"dir": dest, "id": source.id, "files": source.paths, "git": git},
            "submitted_from": here}


def passthrough(names: Sequence[str]) -> dict[str, str]:
    """The values of ``env_passthrough`` names from this environment (sent over ssh, set in
    the cluster-side submitter's environment, never written); SpecError for a missing one."""
    missing = [n for n in names if n not in os.environ]
    if missing:
        raise SpecError(f"run.env_passthrough names {', '.join(missing)}, not set here: "
                        f"export {missing[0]}=... before submitting")
    return {n: os.environ[n] for n in names}


def _json_line(proc_out: bytes, what: str) -> dict[str, Any]:
    text = proc_out.decode("utf-8", "replace").strip().splitlines()
    try:
        return json.loads(text[-1])
    except (IndexError, ValueError):
        raise RemoteError(f"the cluster's answer to {what} is not JSON: "
                          f"{' / '.join(text[-3:]) or 'empty'}") from None


class RemoteJob(JobHandle):
    """A job on a remote cluster: the same handle as :class:`hpctrain.Job` (``job_id``,
    ``state``, ``info()``, ``wait()``, ``logs()``, ``follow()``, ``cancel()``, ``result()``),
    each call one round trip."""

    def __init__(self, cluster: "Cluster", job_id: str, data: Mapping[str, Any] | None = None) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.data = dict(data or {})

    def __repr__(self) -> str:
        return f"RemoteJob(job_id={self.job_id!r}, host={str(self.cluster.target)!r})"

    @property
    def name(self) -> str:
        return str(self.data.get("name", ""))

    # ---- state -------------------------------------------------------------------------------
    def _serve(self, *args: str) -> dict[str, Any]:
        return self.cluster._call(["_serve", *args], f"job {self.job_id}")

    def info(self) -> JobInfo:
        """What Slurm says now (a :class:`~hpctrain.jobs.poll.JobInfo`)."""
        return info_from_json(self.job_id, self._serve("info", self.job_id))

    def done(self) -> bool:
        return bool(self._serve("info", self.job_id)["over"])

    def updates(self, poll_s: float = POLL_S, timeout_s: float | None = None
                ) -> Iterator[Update]:
        """(info, over) at every change the cluster sees (it polls every ``poll_s``), over
        one ssh call that ends after ``timeout_s``."""
        poll = ["--poll", f"{poll_s:g}"] if poll_s != POLL_S else []
        words = self.cluster.conn.hpctrain_words(["_serve", "wait", self.job_id, *poll])
        for line in self.cluster.lines(words, timeout_s):
            data = json.loads(line)
            yield info_from_json(self.job_id, data), bool(data.get("over"))

    # ---- output ------------------------------------------------------------------------------
    def logs(self, rank: int | None = None) -> str:
        args = ["logs", self.job_id] + (["--rank", str(rank)] if rank is not None else [])
        return self.cluster.conn.hpctrain(args).stdout.decode("utf-8", "replace")

    def follow(self, rank: int | None = None) -> Iterator[str]:
        """The log's lines as they are written, until the job has ended (one ssh call)."""
        args = ["logs", self.job_id, "--follow"] + (["--rank", str(rank)] if rank is not None
                                                     else [])
        yield from self.cluster.lines(self.cluster.conn.hpctrain_words(args))

    # ---- control -----------------------------------------------------------------------------
    def cancel(self) -> None:
        proc = self.cluster.conn.hpctrain(["cancel", self.job_id])
        if proc.returncode:
            raise JobError(proc.stderr.decode("utf-8", "replace").strip()
                           .removeprefix("hpctrain: error: "))

    def result(self, timeout_s: float | None = None) -> Any:
        """The callable's return value (a list by rank for several ranks), unpickled here."""
        info = self.wait(timeout_s=timeout_s)
        blobs = [None if b is None else base64.b64decode(b)
                 for b in self._serve("result", self.job_id)["results"]]
        return decode_results(self.job_id, info.state, blobs,
                              f"`hpctrain --host {self.cluster.target} logs {self.job_id}`")


class Cluster:
    """Where jobs go: this login node (``host=None``) or a cluster over SSH.

        cluster = hpctrain.Cluster(host="login1")     # or "alice@login1:2222", an ssh alias
        job = cluster.submit("job.toml")                # the code goes along (a snapshot)
        job = cluster.submit_function(train, lr=3e-4, partition="gpu", nodes=2)
        job.result()

    ``remote_command`` starts hpctrain on the cluster (default ``$HPCTRAIN_REMOTE_COMMAND``
    or ``hpctrain``); ``ssh_config`` replaces ~/.ssh/config. One multiplexed connection
    serves every call; :meth:`close` ends it (else it ends 10 minutes after its last use).
    """

    def __init__(self, host: str | None = None, *, remote_command: str | Sequence[str] | None = None,
                 ssh_config: str | None = None) -> None:
        self.host = host
        self.target = Target.parse(host) if host else None
        self._conn = Connection(self.target, remote_command=remote_command,
                                ssh_config=ssh_config) if self.target else None

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Cluster(host={self.host!r})"

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            raise RemoteError("this Cluster is the login node itself (host=None)")
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    # ---- plumbing ------------------------------------------------------------------------------
    def _call(self, args: Sequence[str], what: str, request: Mapping[str, Any] | None = None
              ) -> dict[str, Any]:
        """Run hpctrain there and parse its last output line as JSON; the cluster's own
        error (its message, exit code) becomes a JobError with that message."""
        data = json.dumps(request).encode() if request is not None else None
        proc = self.conn.hpctrain(args, input=data)
        if proc.returncode:
            message = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise JobError(f"{self.target}: {message[-1].removeprefix('hpctrain: error: ') if message else f'exit {proc.returncode}'}")
        return _json_line(proc.stdout, what)

    def lines(self, words: Sequence[str], timeout_s: float | None = None) -> Iterator[str]:
        """The output lines of ``words`` run there, as they come."""
        yield from self.conn.lines(words, timeout_s)

    # ---- submitting ----------------------------------------------------------------------------
    def submit(self, spec: Any, *, folder: str | None = None, snapshot: bool | None = None,
               templates: Sequence[str] = ()) -> Any:
        """Submit a :class:`~hpctrain.JobSpec` or a spec file; a :class:`hpctrain.Job` here,
        a :class:`RemoteJob` on a remote cluster. The current directory is the code sent
        (``snapshot``, default: the spec's ``[run] snapshot``, else on). ``templates``:
        template directories on the cluster, as ``--templates``."""
        from hpctrain.spec.model import JobSpec

        if not isinstance(spec, JobSpec):
            spec = JobSpec.load(spec)
        if snapshot is not None:
            spec = spec.with_overrides({"run.snapshot": snapshot})
        if self._conn is None:
            from hpctrain.jobs.submit import submit
            return submit(spec, folder=folder, templates=templates)
        request = {"kind": "submit", "spec": spec.to_dict(), "folder": folder, "json": True,
                   "templates": [str(t) for t in templates],
                   "passthrough": passthrough(spec.run.env_passthrough),
                   **stage(self.conn, spec.run.snapshot, workdir=spec.workdir)}
        data = self._call(["_serve", "submit"], "submit", request)
        return RemoteJob(self, str(data["job_id"]), data)

    def submit_function(self, fn: Callable[..., Any], *args: Any, snapshot: bool = True,
                        **kwargs: Any) -> Any:
        """:func:`hpctrain.submit_function` on this cluster: the callable and its arguments
        are pickled here (cloudpickle: a notebook's functions by value) and unpickled by
        the cluster's hpctrain. ``snapshot`` sends the current directory along, so the
        modules the callable imports by name are there."""
        from hpctrain.jobs.submit import submit_function

        if self._conn is None:
            return submit_function(fn, *args, snapshot=snapshot, **kwargs)
        import cloudpickle

        options = {k: kwargs.pop(k) for k in list(kwargs) if k in FUNCTION_OPTIONS}
        if "layout" in options and not isinstance(options["layout"], Mapping):
            options["layout"] = {k: v for k in ("tp", "pp", "dp", "num_layers", "num_heads")
                                 if (v := getattr(options["layout"], k, None)) is not None}
        blob = base64.b64encode(cloudpickle.dumps((fn, args, kwargs))).decode()
        request = {"kind": "function",
                   "function": {"pickle": blob, "options": {**options, "snapshot": snapshot}},
                   "passthrough": passthrough(options.get("env_passthrough", ())),
                   **stage(self.conn, snapshot)}
        data = self._call(["_serve", "submit"], "submit_function", request)
        return RemoteJob(self, str(data["job_id"]), data)

    def submit_sweep(self, spec: Any, grid: Mapping[str, Sequence[str]], *,
                     max_parallel: int | None = None, folder: str | None = None,
                     templates: Sequence[str] = ()) -> Any:
        """:func:`hpctrain.submit_sweep` on this cluster; remote: the sweep's JSON (its id,
        arrays, points) and :meth:`job` gives each task (``ARRAY_TASK``)."""
        from hpctrain.spec.model import JobSpec

        if not isinstance(spec, JobSpec):
            spec = JobSpec.load(spec)
        if self._conn is None:
            from hpctrain.jobs.submit import submit_sweep
            return submit_sweep(spec, grid, max_parallel=max_parallel, folder=folder,
                                templates=templates)
        request = {"kind": "sweep", "spec": spec.to_dict(), "grid": {k: list(v) for k, v in
                                                                      grid.items()},
                   "max_parallel": max_parallel, "folder": folder, "json": True,
                   "templates": [str(t) for t in templates],
                   "passthrough": passthrough(spec.run.env_passthrough),
                   **stage(self.conn, spec.run.snapshot, workdir=spec.workdir)}
        return self._call(["_serve", "submit"], "submit_sweep", request)

    # ---- looking -------------------------------------------------------------------------------
    def job(self, job_id: str) -> Any:
        """The handle of a job submitted earlier (from the cluster's job index)."""
        if self._conn is None:
            from hpctrain.jobs.handle import Job
            return Job.attach(job_id)
        data = self._call(["_serve", "info", job_id], f"job {job_id}")
        return RemoteJob(self, job_id, data)

    def status(self, *job_ids: str) -> list[dict[str, Any]]:
        """``hpctrain status --json``'s jobs: the given ones, or the recent submissions."""
        if self._conn is None:
            from hpctrain.jobs.listing import status_json
            return status_json(tuple(job_ids))["jobs"]
        return self._call(["status", "--json", *job_ids], "status")["jobs"]


# submit_function's own keyword arguments (the rest go to the callable)
FUNCTION_OPTIONS = ("partition", "nodes", "gpus_per_node", "layout", "name", "time", "folder",
                    "setup", "env", "account", "max_num_timeout", "env_passthrough", "access")
