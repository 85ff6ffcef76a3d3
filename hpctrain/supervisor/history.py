"""What the earlier runs of a job left, read at the start of a run: the requeues nobody
entered in the ledger yet (Slurm's own: a preemption, a node failure, an operator's
``scontrol requeue``), why the last one happened, and whether it went past a limit of the
job's requeue budget, in which case this run stops before it starts anything.

Slurm is the source of truth: a run the ledger does not know about is entered from its
previous run's own word when there is one, else from ``sacct``'s run states.
"""

from __future__ import annotations

from hpctrain import protocol as p
from hpctrain.protocol.ledger import line
from hpctrain.slurm import control
from hpctrain.supervisor.config import Config
from hpctrain.supervisor.decision import (FREE_CAUSES, REQUEUE_CAUSES, Decision, limit_text,
                                          missing_requeues, over_limit, runtime_word)
from hpctrain.supervisor.joblog import say
from hpctrain.supervisor.statedir import StateDir


def account_restarts(cfg: Config, state: StateDir
                     ) -> tuple[str | None, Decision | None, dict[str, int]]:
    """Enter the requeues no supervisor counted, and judge the last one against the budget.

    Returns (the last requeue's cause or None on a first run, a stop decision when that
    requeue went past a limit else None, the ledger's requeue counts by cause)."""
    ledger = state.ledger()
    if cfg.restart_count > ledger.last_restart:
        previous = previous_word(state, cfg.restart_count)
        needs_sacct = cfg.restart_count - ledger.last_restart > 1 or previous is None
        states = control.run_states(cfg.key) if needs_sacct else []
        for restart, cause in missing_requeues(ledger.last_restart, cfg.restart_count,
                                               previous, states):
            state.append_ledger(line("requeue", cause=cause, restart_count=restart,
                                     by="slurm"))
        ledger = state.ledger()
    requeues = dict(ledger.requeues)
    if cfg.restart_count == 0:
        return None, None, requeues
    cause = ledger.last_cause or "node_fail"
    count = ledger.requeues.get(cause, 0)
    free = sum(ledger.requeues.get(c, 0) for c in FREE_CAUSES)
    limit = over_limit(cfg.budget, cause, count, cfg.restart_count - free)
    if limit is None:
        return cause, None, requeues
    text = limit_text(limit, cause, count, cfg.restart_count)
    say(f"not running job {cfg.key} again after a {cause} requeue: {text}")
    return cause, Decision("stop", cause, 1, "not run again", limit=limit, detail=text), requeues


def previous_word(state: StateDir, restart_count: int) -> str | None:
    """Why the run before ``restart_count`` ended, in its own words: its supervisor's
    verdict, the runtime's requeue record, or the stop notice it was given."""
    before = restart_count - 1
    verdict = state.read(p.OUTCOME, before)
    if verdict.get("action") in ("requeue", "leave") and verdict.get("cause") in REQUEUE_CAUSES:
        return verdict["cause"]
    word = runtime_word(state.read(p.EXIT, before), None)
    notice = state.read(p.STOP, before).get("cause")
    return word or (notice if notice in ("preemption", "time_limit") else None)
