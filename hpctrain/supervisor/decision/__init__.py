"""Every decision of the job supervisor, as pure functions of facts (no Slurm calls, no
files, no clock): the one place a recovery rule lives. The supervisor gathers raw facts
(Slurm's answers, the ranks' records, the clock), calls these, and acts on the result.

- :mod:`.table`: how a run ended and what to do about it (the decision table: requeue,
  restart in place, finish, stop at a limit, leave it to Slurm);
- :mod:`.start`: the start of a run (requeues nobody counted, why the last run ended,
  whether its requeue went past a limit, a time-limit warning already due);
- :mod:`.running`: while the allocation is in use (what a stop signal means and who hears
  of it, a failed health check, bad nodes and whether a requeued job can avoid them);
- :mod:`.budget`: the requeue budget and its arithmetic;
- :mod:`.facts`: what they look at (:class:`Facts`, :class:`InPlace`, :class:`Caught`) and
  return (:class:`Decision`).

Unit-tested row by row (tests/unit/test_supervisor_decision.py) and through the supervisor
itself against a recorded stand-in of Slurm (tests/unit/test_supervisor_matrix.py).
"""

from hpctrain.supervisor.decision.budget import (FREE_CAUSES, LIMIT_NAMES, REQUEUE_CAUSES,
                                                 Budget, budget_text, limit_text, over_limit)
from hpctrain.supervisor.decision.facts import (CAUSE_OF_RUN_STATE, Caught, Decision, Facts,
                                                InPlace, crash_signature, runtime_word,
                                                signal_name, slurm_event, why_run_ended)
from hpctrain.supervisor.decision.running import (StopResponse, exclusion, health_check,
                                                  notice_cause, respond_to_stop, unhealthy,
                                                  why_bad)
from hpctrain.supervisor.decision.start import (decide_before_start, missing_requeues,
                                                needs_sacct, previous_cause, start_verdict,
                                                warning_at, warning_due)
from hpctrain.supervisor.decision.table import (cause_of_run, death_at_exit, decide,
                                                repeated_crash, requeued_cause)

__all__ = ["CAUSE_OF_RUN_STATE", "FREE_CAUSES", "LIMIT_NAMES", "REQUEUE_CAUSES", "Budget",
           "Caught", "Decision", "Facts", "InPlace", "StopResponse", "budget_text",
           "cause_of_run", "crash_signature", "death_at_exit", "decide",
           "decide_before_start", "exclusion",
           "health_check",
           "limit_text", "missing_requeues", "needs_sacct", "notice_cause", "over_limit",
           "previous_cause", "repeated_crash", "requeued_cause", "respond_to_stop", "runtime_word",
           "signal_name", "slurm_event", "start_verdict", "unhealthy", "warning_at",
           "warning_due",
           "why_bad", "why_run_ended"]
