"""The one writer of what the supervisor decided: the job's ledger (every requeue, in-place
restart, excluded node and stop at a limit) and the outcome record (the verdict on the
last run, which ``hpctrain status`` and ``report`` read). Layout and readers:
:mod:`hpctrain.protocol` and :mod:`hpctrain.protocol.ledger`.

Every verdict has the same fields: cause, action, restart_count, job, status, step,
limit, why, detail, at; a failure adds rank, node, error and failure (the diagnosis), an
in-place restart its attempt, a failed health check its nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hpctrain import protocol as p
from hpctrain.protocol.ledger import line
from hpctrain.protocol.records import Verdict
from hpctrain.supervisor.decision import Decision
from hpctrain.supervisor.diagnosis import Diagnosis
from hpctrain.supervisor.statedir import StateDir
from hpctrain.supervisor.watchdog import Hang


def hang_fields(hang: Hang | None) -> dict[str, str]:
    """What the watchdog found, for the ledger line of a restart or requeue after a hang."""
    if hang is None:
        return {}
    return {"detected_at": f"{hang.detected_at:.1f}", "idle_s": f"{hang.idle_s:.1f}",
            "phase": hang.phase, "ranks": ",".join(map(str, hang.ranks)) or "-"}


def crash_field(signature: str | None) -> dict[str, str]:
    """``crash=20:3f2a...`` on a recovery from a crash whose step and error are known."""
    return {"crash": signature} if signature else {}


class Recorder:
    """Writes one job's ledger lines and verdicts, in its state directory."""

    def __init__(self, state: StateDir, key: str, restart_count: int,
                 clock: Callable[[], float]) -> None:
        self.state, self.key, self.restart_count, self.clock = state, key, restart_count, clock

    # ---- the ledger ------------------------------------------------------------------------
    def requeued(self, cause: str, restart: int, by: str, hang: Hang | None = None,
                 crash: str | None = None) -> None:
        """Requeue number ``restart`` (the run it starts), for ``cause``, made ``by``
        the supervisor or by Slurm (someone else); after a hang, what the watchdog saw;
        after a crash, its signature (the repeated-crash rule reads it back)."""
        self.state.append_ledger(line("requeue", cause=cause, restart_count=restart, by=by,
                                      **hang_fields(hang), **crash_field(crash)))

    def restarted(self, cause: str, attempt: int, hang: Hang | None = None,
                  mode: str = "", crash: str | None = None) -> None:
        """The step starts again in this allocation (attempt ``attempt``); ``mode``
        ``inprocess`` when in its running processes (hpctrain.runtime.run)."""
        how = {"mode": mode} if mode else {}
        self.state.append_ledger(line("restart", cause=cause, restart_count=self.restart_count,
                                      attempt=attempt, at=f"{self.clock():.1f}", **how,
                                      **hang_fields(hang), **crash_field(crash)))

    def slow(self, node: str, factor: float, attempt: int, action: str,
             **figures: float) -> None:
        """A node found slow (``node`` "": the whole job), what it got, and the figures it
        was found by (``own_s``/``others_s`` while the step ran; ``gflops``/
        ``others_gflops`` by the preflight check)."""
        self.state.append_ledger(line("slow", node=node or "-", factor=f"{factor:.2f}",
                                      **{k: f"{v:.1f}" if k == "since" else f"{v:.4g}"
                                         for k, v in figures.items()},
                                      restart_count=self.restart_count, attempt=attempt,
                                      at=f"{self.clock():.1f}", action=action))

    def stopped(self, cause: str, limit: str | None) -> None:
        """A limit of the budget ended the job."""
        self.state.append_ledger(line("stop", cause=cause, restart_count=self.restart_count,
                                      limit=limit))

    def placed(self, attempt: int, nodes: list[str], gpus: int) -> None:
        """The step of ``attempt`` runs on ``nodes`` only ([elastic]: the spares idle)."""
        self.state.append_ledger(line("step", restart_count=self.restart_count,
                                      attempt=attempt, nodes=",".join(nodes), gpus=gpus))

    def excluded(self, node: str, why: str) -> None:
        """The job will not run on ``node`` again."""
        self.state.append_ledger(line("exclude", node=node, cause=why,
                                      restart_count=self.restart_count))

    # ---- the verdict ---------------------------------------------------------------------
    def verdict(self, d: Decision, *, action: str | None = None, status: int | None = None,
                step: int | None = None, diagnosis: Diagnosis | None = None,
                attempt: int | None = None, mode: str = "", node: str = "") -> None:
        """The outcome record of this run: decision ``d`` (``action`` when what was done
        differs from what was decided: ``requeue_failed``), the step's exit status, the
        step the runtime said it reached, the first failure; an in-place restart's
        ``attempt`` and ``mode``, a failed health check's ``node`` list."""
        verdict = Verdict(
            cause=d.cause, action=action or d.action, run_id=self.state.run_id,
            restart_count=self.restart_count, job=self.key, status=status, step=step,
            limit=d.limit or "", why=d.why, detail=d.detail, attempt=attempt, mode=mode,
            at=self.clock(), node=node)
        if diagnosis is not None:
            verdict = replace(verdict, failure=diagnosis.text(), rank=diagnosis.rank,
                              node=diagnosis.node or "", error=diagnosis.error or "")
        self.state.write(p.OUTCOME, verdict.fields())
