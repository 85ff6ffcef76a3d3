"""The requeue ledger: how often a job was requeued or restarted in place, by cause.

The job supervisor keeps it in the job's state directory (``ledger``, see
:mod:`hpctrain.protocol`). One line per requeue, per restart of the step inside the
allocation, per node the job was told to avoid, per step placed on some of the
allocation's nodes (``[elastic]`` spare nodes: the report counts its GPUs, not the
spares'), and one when a limit ended the job::

    requeue cause=preemption restart_count=1 by=supervisor
    restart cause=hang restart_count=1 attempt=1
    exclude node=n2 cause=hang restart_count=1
    step restart_count=1 attempt=1 nodes=n1,n3 gpus=4
    slow node=n2 factor=2.03 own_s=0.61 others_s=0.3 restart_count=1 attempt=1 at=...
    requeue cause=node_fail restart_count=2 by=slurm
    stop cause=preemption restart_count=2 limit=max_preemptions=1

``slow``: a node found slow (``node=-``: the whole job against its own pace), with what
it got (``action=``: replace, exclude, report). ``by=supervisor``: the supervisor requeued the job (``scontrol requeue``). ``by=slurm``:
Slurm did, or somebody else (a preemption at the end of GraceTime, a node failure,
submitit's own requeue, an admin): the run that saw it, or the next one, writes the line.
Reading it is plain file reads: no Slurm call, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpctrain import protocol

# in-place restarts counted against no limit (max_step_restarts): a step started again
# because its rendezvous port was taken at start-up (hpctrain.supervisor.rendezvous)
FREE_RESTARTS = ("port_taken",)


@dataclass(frozen=True)
class Ledger:
    """A parsed ledger: requeues by cause, the newest one, and the limit that ended the job."""

    requeues: dict[str, int] = field(default_factory=dict)
    stop: dict[str, str] = field(default_factory=dict)   # the "stop" line's fields
    last_restart: int = 0                                 # restart_count of the newest requeue
    last_cause: str | None = None                         # its cause
    restarts: dict[str, int] = field(default_factory=dict)  # in-allocation restarts by cause
    excluded: dict[str, str] = field(default_factory=dict)  # node -> why it is avoided
    inprocess: dict[str, int] = field(default_factory=dict)  # ...of them in the running
    #                                                          processes (runtime.run)
    crashes: tuple[str, ...] = ()   # each recovered crash's step and error digest (``crash=``)
    slow: dict[str, float] = field(default_factory=dict)   # node -> its factor when found
    #                                                        ("-": the whole job)
    gpus: tuple[int, int] = (0, 0)  # the newest step's GPUs, and the most any step had

    @property
    def shrunk(self) -> tuple[int, int] | None:
        """(GPUs now, at full width) while the newest step runs on fewer than the job's
        steps have ([elastic] min_nodes, no spare left); None at full width."""
        now, full = self.gpus
        return (now, full) if 0 < now < full else None

    @property
    def total(self) -> int:
        return sum(self.requeues.values())

    @property
    def step_restarts(self) -> int:
        """In-place restarts that count against ``max_step_restarts``."""
        return sum(n for cause, n in self.restarts.items() if cause not in FREE_RESTARTS)

    def recoveries(self, cause: str) -> int:
        """Requeues plus in-place restarts for ``cause`` (a crash's budget counts both)."""
        return self.requeues.get(cause, 0) + self.restarts.get(cause, 0)

    @property
    def limit(self) -> str | None:
        """``max_preemptions=1`` when that limit ended the job, else None."""
        return self.stop.get("limit")


def _fields(words: list[str]) -> dict[str, str]:
    out = {}
    for word in words:
        key, sep, value = word.partition("=")   # a limit's value has its own "="
        if sep:
            out[key] = value
    return out


def entries(text: str) -> list[tuple[str, dict[str, str]]]:
    """Every line of a ledger as (kind, fields), in order; blank lines skipped."""
    out = []
    for line in text.splitlines():
        kind, *words = line.split() or [""]
        if kind:
            out.append((kind, _fields(words)))
    return out


def parse_ledger(text: str) -> Ledger:
    """The ledger in ``text``; unknown and damaged lines are ignored."""
    requeues: dict[str, int] = {}
    restarts: dict[str, int] = {}
    inprocess: dict[str, int] = {}
    excluded: dict[str, str] = {}
    stop: dict[str, str] = {}
    last_restart, last_cause = 0, None
    crashes: list[str] = []
    slow: dict[str, float] = {}
    gpus = (0, 0)
    for kind, fields in entries(text):
        if kind == "step" and fields.get("gpus", "").isdigit():
            gpus = (int(fields["gpus"]), max(gpus[1], int(fields["gpus"])))
        if kind in ("requeue", "restart") and fields.get("crash"):
            crashes.append(fields["crash"])
        if kind == "requeue" and fields.get("cause"):
            requeues[fields["cause"]] = requeues.get(fields["cause"], 0) + 1
            restart = fields.get("restart_count", "")
            if restart.isdigit() and int(restart) >= last_restart:
                last_restart, last_cause = int(restart), fields["cause"]
        elif kind == "restart" and fields.get("cause"):
            restarts[fields["cause"]] = restarts.get(fields["cause"], 0) + 1
            if fields.get("mode") == "inprocess":
                inprocess[fields["cause"]] = inprocess.get(fields["cause"], 0) + 1
        elif kind == "exclude" and fields.get("node"):
            excluded[fields["node"]] = fields.get("cause", "")
        elif kind == "stop" and fields.get("limit"):
            stop = fields
        elif kind == "slow" and fields.get("node"):
            try:
                slow[fields["node"]] = float(fields.get("factor", ""))
            except ValueError:
                pass
    return Ledger(requeues, stop, last_restart, last_cause, restarts, excluded, inprocess,
                  tuple(crashes), slow, gpus)


def line(kind: str, **fields: object) -> str:
    """One ledger line: ``requeue cause=preemption restart_count=1 by=supervisor``."""
    return " ".join([kind, *(f"{k}={v}" for k, v in fields.items())])


def requeues_by_cause(from_sacct: dict[str, int], ledger: Ledger | None) -> dict[str, int]:
    """Requeues by cause: the ledger's, which knows the cause of every requeue the
    supervisor made (sacct says only REQUEUED), unless it lags behind sacct (a requeue
    nobody lived to enter yet): then sacct's."""
    if ledger is not None and ledger.total >= sum(from_sacct.values()):
        return ledger.requeues
    return from_sacct


def read_ledger(key: str, *bases: str) -> Ledger | None:
    """The ledger of job ``key`` from the first of ``bases`` (checkpoint dir, submit dir)
    whose state directory has one; None when there is none."""
    for base in bases:
        if not base:
            continue
        try:
            text = (protocol.state_dir(base, key) / protocol.LEDGER).read_text(errors="replace")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
            continue
        return parse_ledger(text)
    return None
