"""The job's state directory (layout in :mod:`hpctrain.protocol`), as its supervisor keeps it.

State must not leak between jobs: a job id is reused after Slurm's ids reset, on another
cluster sharing the storage, or by a resubmission into the same checkpoint dir. So a run
first *claims* the directory: a fresh job (restart 0) moves aside whatever is there; a
requeued run keeps it only when its ``identity`` says it belongs to this job (same cluster,
same submission when hpctrain submitted it), else moves it aside too. Records then carry
the identity's ``run_id`` and their run's restart count, and only matching ones are read.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from hpctrain import access, protocol
from hpctrain.errors import SupervisorError
from hpctrain.protocol.ledger import Ledger, parse_ledger
from hpctrain.protocol.records import ExitRecord, Identity, StopNotice, Verdict, of_run


def check_own(base: Path, path: Path) -> None:
    """Refuse a state directory (or one of its parents below ``base``) that is not safely
    this user's: in a shared submit or checkpoint directory a neighbour could have planted
    it, with records that would steer this job's requeues. The base itself may be shared."""
    part = base
    for name in path.relative_to(base).parts:
        part = part / name
        if not os.path.lexists(part):
            return
        why = access.unsafe_reason(part)
        if why:
            raise SupervisorError(f"not using the job's state directory {part}: {why}. "
                                  f"Remove it if it is yours, or submit from (or checkpoint "
                                  f"to) a directory of your own")


@dataclass(frozen=True)
class StateDir:
    """A claimed state directory and the id of the job that owns it."""

    path: Path
    run_id: str

    def file(self, name: str) -> Path:
        return self.path / name

    # ---- claiming ----------------------------------------------------------------------
    @classmethod
    def claim(cls, base: str, key: str, restart_count: int, cluster: str,
              submission: str) -> tuple[StateDir, str]:
        """Claim the state directory of job ``key`` under ``base``; (state dir, note). The
        note says what was moved aside and why ('' when nothing was)."""
        path = protocol.state_dir(base, key)
        check_own(Path(base), path)
        identity = Identity.parse(protocol.read_record(path / protocol.IDENTITY))
        foreign = foreign_reason(identity, restart_count, cluster, submission)
        note = ""
        if foreign and path.exists() and any(path.iterdir()):
            aside = path.with_name(f"{path.name}.stale-{int(time.time())}-{os.getpid()}")
            path.rename(aside)
            note = f"moved {path} aside to {aside.name}: {foreign}"
        if foreign or identity is None:
            identity = Identity(uuid.uuid4().hex, key, cluster, submission,
                                f"{time.time():.0f}")
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            protocol.write_record(path / protocol.IDENTITY, identity.fields())
        return cls(path, identity.run_id), note

    # ---- the ledger --------------------------------------------------------------------
    def ledger(self) -> Ledger:
        try:
            return parse_ledger(self.file(protocol.LEDGER).read_text(errors="replace"))
        except FileNotFoundError:
            return Ledger()

    def append_ledger(self, text: str) -> None:
        with open(self.file(protocol.LEDGER), "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    # ---- records -----------------------------------------------------------------------
    def exit_record(self, restart_count: int | None = None) -> ExitRecord | None:
        """The runtime's exit record when this job wrote it (and, if given, that run)."""
        record = ExitRecord.parse(protocol.read_record(self.file(protocol.EXIT)))
        return record if of_run(record, self.run_id, restart_count) else None

    def verdict(self, restart_count: int | None = None) -> Verdict | None:
        """The supervisor's verdict when this job wrote it (and, if given, on that run)."""
        record = Verdict.parse(protocol.read_record(self.file(protocol.OUTCOME)))
        return record if of_run(record, self.run_id, restart_count) else None

    def stop_notice(self, restart_count: int | None = None) -> StopNotice | None:
        """The stop notice when this job wrote it (and, if given, in that run)."""
        record = StopNotice.parse(protocol.read_record(self.file(protocol.STOP)))
        return record if of_run(record, self.run_id, restart_count) else None

    def write(self, name: str, fields: dict[str, object]) -> None:
        """Write record ``name`` (a typed record's ``fields()``) under this job's run_id."""
        protocol.write_record(self.file(name), {"run_id": self.run_id, **fields})

    def clear(self, *names: str) -> None:
        """Remove per-run records (the stop notice, the runtime's exit record) of an
        earlier run, once they have been read: whatever is there afterwards is this run's."""
        for name in names:
            self.file(name).unlink(missing_ok=True)


def foreign_reason(identity: Identity | None, restart_count: int, cluster: str,
                   submission: str) -> str:
    """Why a state directory with ``identity`` is not this job's ('' when it is). Pure."""
    if restart_count == 0:
        return "a fresh job (restart 0) owns nothing yet: left by an earlier job with this id"
    if identity is None:
        return "it has no identity record (written by another job or an older hpctrain)"
    if cluster and identity.cluster not in ("", cluster):
        return f"it belongs to cluster {identity.cluster!r}, this is {cluster!r}"
    if submission and identity.submission not in ("", submission):
        return "it belongs to another submission with this job id"
    return ""
