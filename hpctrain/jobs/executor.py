"""Submission: hpctrain's rendered script, handed to submitit's Slurm executor.

There is one script generator: ``hpctrain.render.script``. :class:`RenderedExecutor` is
submitit's ``SlurmExecutor`` with its submission-file hook
(``_make_submission_file_text``) returning the rendered script verbatim, so the file
Slurm runs is byte for byte what ``hpctrain render`` prints. submitit keeps doing what
it is good at: the job folder, pickling callables, the checkpoint/requeue protocol,
result files (read back by :mod:`hpctrain.jobs.results`). The ``sbatch`` call itself
goes through :func:`hpctrain.slurm.client.run` (bounded retries on controller trouble,
Slurm's own message on refusal, "no SLURM client on this machine" when sbatch is missing).

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

from hpctrain import access, protocol
from hpctrain.errors import AccessError, SlurmError, SlurmNotFound, SlurmTimeout
from hpctrain.slurm import client, control
from hpctrain.slurm.parse import parse_sbatch_parsable

SBATCH_RETRIES = 2
SBATCH_TIMEOUT_S = 30.0   # sbatch waits for the controller this long (then: Slurm's queue says)


def submitit_command(python: str, folder: Path) -> list[str]:
    """The argv that runs a pickled callable in the job (submitit's own entry point)."""
    return [python, "-u", "-m", "submitit.core._submit", str(folder)]


class RenderedExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor whose submission file is a script hpctrain rendered.

    ``num_tasks`` is the number of Slurm tasks the script starts (result files are
    per task); ``sbatch_args`` are extra command-line options (a sweep's ``--array``).
    ``access_level`` ("private" or "group", :mod:`hpctrain.access`) sets the modes of the
    job folder and of everything in it, Slurm's log files included.
    """

    def __init__(self, folder: str | os.PathLike[str], script: str, num_tasks: int, *,
                 sbatch_args: Sequence[str] = (), time_min: int = 60,
                 max_num_timeout: int = 3, python: str | None = None,
                 access_level: str = "private") -> None:
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
        self.modes = access.modes(access_level)
        prepare_folder(self.folder, self.modes.dir)

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
        prepare_folder(base, self.modes.dir)
        tmp = base / f".submission_file_{tmp_uuid}.sh"
        text = self._make_submission_file_text(command, tmp_uuid).encode("utf-8")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, self.modes.file)
        with os.fdopen(fd, "wb") as fh:
            fh.write(text)
        try:
            # Retried only when the controller was never reached: an sbatch that timed
            # out may already have queued the job, and a retry would queue it twice.
            # sbatch passes its environment on: the job's supervisor finds this
            # submission's id there and never takes another job's state for its own
            res = client.run(["sbatch", "--parsable", *self.sbatch_args, str(tmp)],
                             timeout=SBATCH_TIMEOUT_S, retries=SBATCH_RETRIES, idempotent=False,
                             env={protocol.SUBMISSION_ID: tmp_uuid}, umask=self.modes.umask)
        except SlurmNotFound:
            tmp.unlink(missing_ok=True)
            raise
        except SlurmTimeout as exc:
            # sbatch gave up waiting, not Slurm: the job may be queued all the same (a
            # controller busy with a 10,000-point sweep). Slurm's queue says which.
            job_id = control.queued_from(str(tmp))
            if job_id is None:
                tmp.unlink(missing_ok=True)
                raise SlurmError(f"sbatch did not answer ({exc}) and Slurm's queue has no "
                                 f"job from {tmp.name}: nothing was queued. Submit again "
                                 "once `scontrol ping` answers quickly") from None
            res = client.Result(("sbatch",), 0, job_id + "\n", "")
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

    def _set_job_permissions(self, folder: Path) -> None:
        """submitit's hook after each submission: what submitit wrote with the default
        umask (pickles, the job id file) gets the access level's file mode. Only this
        user's regular files; a symlink is never followed."""
        for entry in os.scandir(folder):
            st = entry.stat(follow_symlinks=False)
            if entry.is_file(follow_symlinks=False) and st.st_uid == os.geteuid():
                os.chmod(entry.path, self.modes.file & st.st_mode)


def prepare_folder(folder: Path, mode: int, ancestors: int = 1) -> None:
    """Make a job folder with ``mode``, or check the existing one is this user's own, and
    the same of its ``ancestors`` nearest parents first (the jobs root: a folder of one's
    own inside a neighbour's directory is his to swap). :class:`AccessError` naming the
    path and its owner otherwise."""
    folder = Path(folder)
    for path in [*reversed(folder.parents[:ancestors]), folder]:
        why = access.own_dir(path, mode)
        if why:
            raise AccessError(f"not using job folder {path}: {why}. Use a folder of your "
                              "own (--folder, or HPCTRAIN_JOBS_DIR) or remove this one if "
                              "you made it")


def refusal_message(text: str) -> str:
    """Slurm's own words from a failed sbatch, without our 'sbatch failed:' prefix."""
    text = text.removeprefix("sbatch failed:").strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " / ".join(lines) or "no message"
