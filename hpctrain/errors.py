"""The one exception root of hpctrain.

Every error a user can cause or meet derives from :class:`HpctrainError`. The CLI
(``hpctrain.cli.main``) turns it into one message and an exit code in one place;
Python callers catch it like any exception. Messages name the offending value and
the fix, e.g. ``tp=3 does not divide gpus_per_node=2: choose tp in {1, 2}``.
"""

from __future__ import annotations


class HpctrainError(Exception):
    """Root of every error hpctrain raises on purpose."""

    exit_code: int = 1


class SpecError(HpctrainError):
    """A job spec is malformed, has an unknown key or an unsafe value."""

    exit_code = 2


class LayoutError(SpecError):
    """A data/tensor/pipeline layout does not fit the job's GPUs or model."""


class TemplateError(HpctrainError):
    """A template is missing, broken, or renders an unsafe script."""

    exit_code = 2


class PartitionError(SpecError):
    """An unknown partition or a malformed partition facts file."""


class SlurmError(HpctrainError):
    """A SLURM command failed; carries Slurm's own message."""

    exit_code = 3


class SlurmNotFound(SlurmError):
    """No SLURM client binaries on this machine."""


class SlurmTimeout(SlurmError):
    """A SLURM command did not answer in time (controller down or slow)."""


class JobError(HpctrainError):
    """A job ended badly, or asked for something it does not have (a script job's result)."""

    exit_code = 6


class JobIdError(HpctrainError):
    """What was given as a job id is not one (``hpctrain.jobs.ids``)."""

    exit_code = 2


class AccessError(HpctrainError):
    """A path hpctrain would write or reuse is not safely the user's own: a symlink, another
    user's file or folder, or one every user may write. Never followed, never fixed up."""

    exit_code = 13


class DevclusterError(HpctrainError):
    """The local development cluster could not be brought up, inspected or down."""

    exit_code = 4


class CheckpointError(HpctrainError):
    """A checkpoint cannot be written, read or verified."""

    exit_code = 5


class StorageUnavailable(CheckpointError):
    """The checkpoint storage cannot be used for now (its root is locked by a job that may
    be gone: a dead or evicted node). Not the training code's fault: a job that dies of it
    leaves a ``cause=storage`` record and its supervisor requeues it
    (``requeue.max_storage_retries``)."""

    requeue_cause = "storage"   # read by the runtime's crash record (duck-typed)


class CheckpointCorrupt(CheckpointError):
    """A checkpoint failed verification (checksum, size or manifest); ``ckpt verify`` exits 1."""

    exit_code = 1


class PlanError(HpctrainError):
    """The planner got nonsense input or found no layout that fits."""

    exit_code = 2


class SupervisorError(HpctrainError):
    """The job supervisor cannot run: it is not inside a Slurm batch job, or the rendered
    script handed it a malformed setting."""

    exit_code = 2


class ReportError(HpctrainError):
    """``hpctrain report`` cannot gather a job's facts (no state directory, no sacct)."""


class HostlistError(HpctrainError, ValueError):
    """A Slurm host list that Slurm would refuse too (``n[3-1]``, ``n[]``, ``n[1-2``)."""

    exit_code = 2


class RemoteError(HpctrainError):
    """``--host``: the cluster could not be reached or used over SSH (name resolution,
    connection, authentication, host key, hpctrain missing or of another version there)."""

    exit_code = 7


# Every exit code the ``hpctrain`` command gives, and what it means: shown by
# ``hpctrain --help`` and docs/cli.md (a test keeps both equal to this table and to the
# classes above).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success; `submit --wait`: the job COMPLETED"),
    (1, "an error of no other kind; `ckpt verify`: a checkpoint failed verification"),
    (2, "bad input: a spec, layout, partition, template, plan, host list, job id or option"),
    (3, "Slurm refused or failed (its message is shown), or no Slurm client here"),
    (4, "the devcluster could not be brought up, inspected or down"),
    (5, "a checkpoint cannot be written, read or verified"),
    (6, "no such job, or a result a script job lacks; `submit --wait`: the job failed"),
    (7, "`--host`: the cluster could not be reached or used over SSH"),
    (8, "`submit --wait`: the job was cancelled"),
    (13, "a path is not safely yours (a symlink, another user's, writable by all)"),
    (130, "interrupted (Ctrl-C)"),
)
