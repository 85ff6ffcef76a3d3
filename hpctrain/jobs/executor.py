"""Submission: hpctrain's rendered script, handed to submitit's Slurm executor.

There is one script generator: ``hpctrain.render.script``. :class:`RenderedExecutor` is
submitit's ``SlurmExecutor`` with its submission-file hook
(``_make_submission_file_text``) returning the rendered script verbatim, so the file
Slurm runs is byte for byte what ``hpctrain render`` prints. submitit keeps doing what
it is good at: the job folder, pickling callables, the checkpoint/requeue protocol,
result files. The ``sbatch`` call itself goes through :func:`hpctrain.slurm.client.run`
(bounded retries on controller trouble, Slurm's own message on refusal, "no SLURM
client on this machine" when sbatch is missing).

This module imports submitit, so the CLI imports it only at the moment it submits
(never for ``--dry-run``, ``status``, ``logs`` or ``cancel``).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Sequence

import submitit
from submitit.core.utils import JobPaths

from hpctrain import protocol
from hpctrain.errors import SlurmError, SlurmNotFound
from hpctrain.slurm import client
from hpctrain.slurm.parse import parse_sbatch_parsable

SBATCH_RETRIES = 2


def submitit_command(python: str, folder: Path) -> list[str]:
    """The argv that runs a pickled callable in the job (submitit's own entry point)."""
    return [python, "-u", "-m", "submitit.core._submit", str(folder)]


class RenderedExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor whose submission file is a script hpctrain rendered.

    ``num_tasks`` is the number of Slurm tasks the script starts (result files are
    per task); ``sbatch_args`` are extra command-line options (a sweep's ``--array``).
    """

    def __init__(self, folder: str | os.PathLike[str], script: str, num_tasks: int, *,
                 sbatch_args: Sequence[str] = (), time_min: int = 60,
                 max_num_timeout: int = 3, python: str | None = None) -> None:
        if not client.have("sbatch"):
            # before submitit's own check, which would only say "srun" is missing
            raise SlurmNotFound("no SLURM client on this machine: 'sbatch' is not on PATH "
                                "(install slurm-client, or use `hpctrain devcluster up`)")
        super().__init__(folder, max_num_timeout=max_num_timeout, python=python)
        # submitit uses "time" for its own timeout bookkeeping of checkpointable callables
        self.update_parameters(time=max(1, time_min))
        self.script = script
        self.sbatch_args = tuple(sbatch_args)
        self._tasks = max(1, num_tasks)

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        # The hook: the rendered script, untouched. For a function job the script
        # already runs `command` (submitit's entry point) on every rank.
        return self.script

    def _num_tasks(self) -> int:
        return self._tasks

    def submit_script(self) -> Any:
        """Submit the rendered script itself, with no pickled callable (a script job)."""
        return self._submit_command(self._submitit_command_str)

    def _submit_command(self, command: str) -> Any:
        """submitit's submission step (``PicklingExecutor._submit_command``, mirrored step by
        step) with sbatch run through hpctrain.slurm.client instead of CommandFunction.

        A private member of submitit: setup.cfg pins the submitit versions the tests
        prove, and tests/unit/test_submitit_contract.py fails when upstream's steps change."""
        tmp_uuid = uuid.uuid4().hex
        base = JobPaths.get_first_id_independent_folder(self.folder)
        base.mkdir(parents=True, exist_ok=True)
        tmp = base / f".submission_file_{tmp_uuid}.sh"
        tmp.write_text(self._make_submission_file_text(command, tmp_uuid), encoding="utf-8")
        try:
            # Retried only when the controller was never reached: an sbatch that timed
            # out may already have queued the job, and a retry would queue it twice.
            # sbatch passes its environment on: the job's supervisor finds this
            # submission's id there and never takes another job's state for its own
            res = client.run(["sbatch", "--parsable", *self.sbatch_args, str(tmp)],
                             retries=SBATCH_RETRIES, idempotent=False,
                             env={protocol.SUBMISSION_ID: tmp_uuid})
        except SlurmNotFound:
            tmp.unlink(missing_ok=True)
            raise
        except SlurmError as exc:
            tmp.unlink(missing_ok=True)
            raise SlurmError(f"Slurm refused the job: {refusal_message(str(exc))} "
                             "(check partition, nodes, GPUs, time and account in the spec; "
                             "`hpctrain submit --dry-run` shows the script)") from None
        job_id = parse_sbatch_parsable(res.stdout)
        tasks = list(range(self._num_tasks()))
        job = self.job_class(folder=self.folder, job_id=job_id, tasks=tasks)
        job.paths.move_temporary_file(tmp, "submission_file", keep_as_symlink=True)
        self._write_job_id(job.job_id, tmp_uuid)
        self._set_job_permissions(job.paths.folder)
        return job


def refusal_message(text: str) -> str:
    """Slurm's own words from a failed sbatch, without our 'sbatch failed:' prefix."""
    text = text.removeprefix("sbatch failed:").strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " / ".join(lines) or "no message"


def function_results(job: Any, info: Any) -> Any:
    """Read a finished function job's result files (submitit's), one per rank.

    Returns the value for a one-task job, a list by rank otherwise. A rank that raised
    re-raises here as JobError with its traceback; a job that ended without results
    (cancelled, preempted and not requeued, node failure) says its state.
    """
    from submitit.core.utils import UncompletedJobError

    from hpctrain.errors import JobError

    ntasks = max(1, job.entry.num_tasks)
    sjob = submitit.SlurmJob(folder=job.folder, job_id=job.job_id, tasks=list(range(ntasks)))
    try:
        values = sjob.results()
    except UncompletedJobError as exc:
        raise JobError(f"job {job.job_id} ended {info.state} without a result:\n{exc}") from None
    return values if ntasks > 1 else values[0]
