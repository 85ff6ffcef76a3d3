"""The runtime's exit record: why a training process left, for its supervisor.

Launchers (torchrun, deepspeed, mpirun) report their own exit code when a worker leaves,
so the supervisor may never see 75/76. Rank 0 therefore writes ``$HPCTRAIN_EXIT_FILE``
(the job's state directory, :mod:`hpctrain.protocol`) just before leaving for requeue::

    cause=preemption
    exit_code=75
    requeue=1
    step=120
    restart_count=0
    job_id=123
    run_id=0a85...

and an uncaught exception leaves a ``cause=user_crash`` record (crashrecord.py). The
``key=value`` format and its atomic writer are :mod:`hpctrain.protocol`'s.
"""

from __future__ import annotations

from hpctrain.protocol import read_record, write_record
from hpctrain.protocol.records import ExitRecord

__all__ = ["ExitRecord", "inferred_last_cause", "read_record", "write_record"]


def inferred_last_cause(record: ExitRecord | None, restart_count: int) -> str | None:
    """The cause the previous run left with, inferred from its record (used only without
    a supervisor: the supervisor passes the cause in ``HPCTRAIN_LAST_EXIT_CAUSE``).

    First run: None. Requeued and the record comes from the run just before: its cause.
    Requeued without such a record: nobody lived to write it, i.e. ``node_fail`` (or a
    kill before the emergency save finished, which recovers the same way). A record that
    did not ask for a requeue (``requeue=0``: the surviving ranks' crash record when a
    node dies under them) yet was followed by one: Slurm requeued it, ``node_fail`` too.
    """
    if restart_count == 0:
        return None
    if (record is not None and record.restart_count == restart_count - 1 and record.cause
            and record.requeue is not False):
        return record.cause
    return "node_fail"
