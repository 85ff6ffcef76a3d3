"""How a run ended and what to do about it: the decision table (:func:`decide`). Pure.

The scheduler is the source of truth; the training process's word only adds detail. Its
rows, in order (the first that matches decides):

===============  ================================================  ==============  =====================
row              facts                                             cause           action
===============  ================================================  ==============  =====================
slurm-requeued   Slurm already requeued this run (Restarts > ours)  as Slurm saw it  leave it to Slurm
preempted        Slurm is preempting it (PreemptTime set)           preemption      requeue, any exit code
cancelled        Slurm ended the run (scancel, an admin), even if   cancelled       finish, never undone
                 the step then exited 0 (it stopped early)
exit-0           the step exited 0                                  completed       finish (exit 0)
time-limit       Slurm's time limit was reached (Reason=TimeLimit)  time_limit      requeue
died-at-exit     every rank's script returned and its saves are     completed       finish (exit 0), the
                 durable (its own word), then a rank died of a                      death named
                 signal at exit, a stop passed on ended them, or
                 the exit hung
warned           the batch step caught the requeue signal           time_limit      requeue
stopped          it caught SIGTERM/SIGINT, Slurm says nothing       cancelled       finish: a stop request
                 (Slurm unreachable: cause ``unknown``, finish)
node-slow        a node of the step was taken out for slowness      node_fail       restart in place on a
                 ([health] on_slow = replace, a spare was left)                     spare, else requeue
node-lost        a node of the step was lost (its ranks went        node_fail       restart in place on a
                 silent, and it was taken from the job; or its                      spare, else shrunk
                 ranks died without a word and it answered no                       ([elastic] min_nodes),
                 step)                                                              else requeue
                                                                                    (max_node_failures)
hang             the watchdog stopped a hung step                   hang            restart in place, else
                                                                                    requeue (max_hangs)
runtime-requeue  the runtime asked for a requeue (75/76, record;    its cause       requeue
                 storage trouble)
out-of-memory    Slurm ended the step for memory (slurmstepd's     out_of_memory   finish: the same
                 words in its output)                                               request fails again
port-taken       its rendezvous could not bind its port at start-   port_taken      restart in place on
                 up, and this node (the first) still cannot bind                    the next free port
                 it: taken by another process since the script                      (counted against no
                 checked it (:mod:`~hpctrain.supervisor.rendezvous`)                limit; PORT_TRIES)
shrunk-failed    a step shrunk without a spare ([elastic]           node_fail       requeue (the next start
                 min_nodes) failed before any rank finished a                       asks for the full size)
                 step in it (the script may not run shrunk)
crash            the step failed                                    user_crash      finish, or (within
                                                                                    max_crash_restarts)
                                                                                    restart in place, else
                                                                                    requeue
===============  ================================================  ==============  =====================

A crash's budget, ``max_crash_restarts``, defaults to CRASH_RESTARTS_RUN (3) when the
ranks run under ``hpctrain.runtime.run`` (its user asked to survive a crash) and to 0
otherwise (a bug is not run again). Under that default a crash at the same step with the
same error as an earlier one of the job ends it (:func:`repeated_crash`): a deterministic
bug is replayed, not retried. A number in the spec overrides both.

Row died-at-exit needs the runtime's word (:mod:`hpctrain.supervisor.finish`) *and* a death that is
not the script's choice: a signal (torch's gloo group aborting in the C++ destructors), a
stop the batch step passed on while they left (torchrun's agent dies of the TERM with exit
code 1 and takes the ranks along), or a teardown the watchdog found hung. It comes after
Slurm's own facts (a preemption is still requeued, a cancellation still final) and before
the signals the batch step caught: a time-limit warning that arrives once every save is
durable has nothing left to save, and a requeue would only repeat the start-up. A script
that exits 3 after its work is not completed, and a script without the runtime that
aborts at exit is reported as it ended, with the likely cause and its fix in the
diagnosis.

"requeue" is within the budget (``max_requeues`` and the cause's own limit), else "stop":
the job ends and says which limit. "restart in place" runs the step again in the same
allocation (no queue wait) while ``max_step_restarts`` lasts, the allocation's nodes are
healthy and enough time is left (:class:`InPlace`); a crash's limit counts its in-place
restarts and its requeues together. Not a row: before the step starts, a node failing the
partition's health check gets the job requeued without it
(:func:`~hpctrain.supervisor.decision.running.health_check`), and such a requeue
(``FREE_CAUSES``) does not count against ``max_requeues``. The same rows decide a run that
never started its step (a stop signal or a preemption during start-up): then the step's
exit status is unknown.
"""

from __future__ import annotations

from hpctrain.supervisor.decision.budget import budget_text, counted, limit_text, over_limit
from hpctrain.supervisor.decision.facts import (Decision, Facts, crash_signature, crash_step,
                                                runtime_word, signal_name, slurm_event,
                                                why_run_ended)


def requeued_cause(f: Facts) -> str | None:
    """Row slurm-requeued: why Slurm requeued this run (:func:`why_run_ended`: no verdict yet, sacct's
    end state of this run, its stop notice, the runtime's request), else ``node_fail`` when a
    node of the step was found lost (slurmdbd may record the run's NODE_FAIL seconds after
    the requeue, and a run that gave a node to its spare ends in a RESIZING row that says
    nothing); None when nobody says. A node down that is not the step's (one given back
    earlier) says nothing of this requeue."""
    said = why_run_ended(run_state=f.run_state, notice=f.notice, record=f.record,
                         status=f.status)
    if said is None and f.lost:
        return "node_fail"
    return said


def death_at_exit(f: Facts) -> str | None:
    """Row died-at-exit: ``rank 1 then died at exit (SIGABRT)`` when the step failed only after every
    rank's work ended with its saves durable; None when that is not what happened."""
    if f.finish is None or not f.finish.done or not f.status:
        return None
    if f.hang_phase == "exited":
        return "their exit then hung and the watchdog ended it"
    died_of = f.failure.signal if f.failure is not None else None
    if died_of is None and f.status > 128:     # srun: 128 + the task's signal
        died_of = signal_name(f.status)
    died = died_of is not None and not died_of.startswith("status")
    rank = f.failure.rank if f.failure is not None else None
    who = "a rank" if rank is None else f"rank {rank}"
    if f.caught:
        # the stop was passed on while they left: torchrun's agent dies of a TERM with its
        # own exit code 1, and takes the finished ranks with it; a rank torn down that way
        # can die of its own signal (gloo's abort), a fact said beside the stop, never
        # instead of it
        stop = f"the stop (SIG{f.caught[-1].name}) then ended the step as they left"
        return f"{stop}; {who} died of {died_of}" if died else stop
    if died:
        return f"{who} then died at exit ({died_of})"
    return None                                # an exit code: the script's own choice


def cause_of_run(f: Facts) -> tuple[str, str]:
    """The rows after ``slurm-requeued``: (cause, why)."""
    event = slurm_event(f.view, f.restart_count)
    names = [c.name for c in f.caught]
    if event == "preemption":
        return "preemption", "Slurm is preempting the job (PreemptTime is set)"
    if event == "ended":   # a script that stops on the signal and exits 0 stopped early
        return "cancelled", f"Slurm ended the job ({f.view.state if f.view else ''}, " \
                            "no preemption or time limit: scancel or an admin)"
    if f.status == 0:
        return "completed", "the training step exited 0"
    if event == "time_limit":
        return "time_limit", "the job reached its time limit"
    death = death_at_exit(f)
    if death is not None:
        return "completed", f"{f.finish.text()}; {death}"  # type: ignore[union-attr]
    if f.requeue_signal in names:
        return "time_limit", f"caught SIG{f.requeue_signal}, the time-limit warning (--signal)"
    stops = [n for n in names if n in ("TERM", "INT")]
    if stops and event == "unknown":
        return "unknown", f"caught SIG{stops[0]} and Slurm could not be asked why"
    if stops:
        return "cancelled", f"caught SIG{stops[0]} without a preemption, time limit or " \
                            "cancellation in Slurm: a stop request"
    if f.slow:
        return "node_fail", f"node(s) {','.join(f.slow)} of the step ran slower than the " \
                            "others for long enough to be taken out ([health] on_slow = " \
                            "replace: a fault of the node that slows every step)"
    if f.lost:
        return "node_fail", f"node(s) {','.join(f.lost)} of the step were lost (its ranks " \
                            "went silent or died without a word, and it answered no step " \
                            "or left the job)"
    if f.faulty:
        return "node_fail", f"the ranks on {','.join(f.faulty)} died without a word of " \
                            "their own (no exception, no crash record: killed) while the " \
                            "node answers a step: a fault of the node, not of the script"
    if f.hang:
        return "hang", f"the watchdog stopped the hung step: {f.hang}"
    word = runtime_word(f.record, f.status)
    if word is not None:
        return word, f"the training process asked for a requeue ({word})"
    if f.memory:
        return "out_of_memory", f"Slurm ended the step for memory ({f.memory}): ask for " \
                                "more ([resources] mem_per_node_gb) or use less"
    if f.port is not None and f.restarts.get("port_taken", 0) < PORT_TRIES:
        return "port_taken", f"the rendezvous could not bind port {f.port[0]}: another " \
                             "process took it after the script checked it"
    if f.status is None:
        return "unknown", "the training step did not run"
    return "user_crash", f"the training step failed ({signal_name(f.status)})"


def repeated_crash(f: Facts) -> str | None:
    """The repeated-crash rule of the default crash budget (``max_crash_restarts`` left
    out): this crash's step and error are those of an earlier crash of the job, so a
    restart would replay the same bug. Its words, or None (a number in the spec
    overrides the rule, and a crash without the runtime's record has no step to compare)."""
    signature = crash_signature(f.record)
    if not f.budget.crash_default or signature is None or signature not in f.crashes:
        return None
    return f"crashed twice at step {crash_step(f.record)} with the same error: not transient " \
           "(the default crash budget stops there; set [requeue] max_crash_restarts to " \
           "retry anyway)"


IN_PLACE = ("hang", "user_crash", "node_fail")      # causes restarted in the allocation
PORT_TRIES = 8       # a job's moves of its rendezvous port (row port-taken)
COUNTED_IN_PLACE = ("user_crash", "node_fail")     # ...whose limit counts those restarts


def decide(f: Facts) -> Decision:
    """The table in this module's docstring."""
    step_code = f.status if f.status is not None else 0
    if slurm_event(f.view, f.restart_count) == "requeued":
        cause = requeued_cause(f) or "requeued"
        return Decision("leave", cause, step_code, f"Slurm already requeued the job ({cause})")
    cause, why = cause_of_run(f)
    if cause == "completed":
        return Decision("finish", cause, 0, why, detail=death_at_exit(f) or "")
    if cause == "port_taken" and f.port is not None and not f.inplace.obstacle:
        return Decision("restart", cause, 0, why,   # at start-up: nothing was lost
                        detail=f"on port {f.port[1]}, counted against no limit")
    if cause == "port_taken":        # the allocation cannot take a restart: a crash's fate
        cause = "user_crash"
    shrink_failed = cause == "user_crash" and bool(f.shrunk_failed)
    if shrink_failed:                # never worse off than without the shrink: requeued
        cause, why = "node_fail", (
            f"the step shrunk to {f.shrunk_failed} GPUs ([elastic] min_nodes) failed before "
            f"any rank finished a step ({why}): the script may not run at a smaller width "
            "(a state sharded across its data-parallel ranks, ZeRO's or FSDP's); requeued "
            "to start at full size")
    if cause in ("cancelled", "unknown", "out_of_memory") or (cause == "user_crash" and
                                 f.budget.limit_of(cause, f.wrapped) == ("max_crash_restarts", 0)):
        return Decision("finish", cause, step_code or 1, why)
    repeated = repeated_crash(f) if cause == "user_crash" else None
    if repeated is not None:
        return Decision("finish", cause, step_code or 1, repeated)
    if cause in COUNTED_IN_PLACE:
        # a crash's (a lost node's) limit counts every recovery from it, in place or by
        # requeue: a crash loop, a node after node, ends at its limit either way
        count = f.requeues.get(cause, 0) + f.restarts.get(cause, 0) + 1
        limit = over_limit(f.budget, cause, count, 0, f.wrapped)
        if limit is not None:
            return Decision("stop", cause, step_code or 1, why, limit=limit,
                            detail=limit_text(limit, cause, count, f.restart_count))
    if cause in IN_PLACE and f.inplace.allowed and not shrink_failed:
        spare = "" if cause != "node_fail" or f.inplace.healthy is None else \
            f", shrunk: {f.inplace.healthy} good node(s) left of {f.inplace.needed}, no " \
            f"spare ([elastic] min_nodes={f.inplace.least})" if f.inplace.shrinks \
            else " on a spare node"
        # a crash's own budget too: its default depends on the script (runtime.run or not)
        crash = f", crash recovery {f.restarts.get(cause, 0) + f.requeues.get(cause, 0) + 1} " \
                f"of {'='.join(map(str, f.budget.limit_of(cause, f.wrapped) or ()))}" \
            if cause == "user_crash" else ""
        return Decision("restart", cause, 0, why,
                        detail=f"in-place restart {f.inplace.used + 1} of "
                               f"max_step_restarts={f.inplace.max}{spare}{crash}")
    count = f.requeues.get(cause, 0) + 1
    if cause in COUNTED_IN_PLACE:
        count += f.restarts.get(cause, 0)
    restart = counted(f.restart_count + 1, f.requeues)
    limit = over_limit(f.budget, cause, count, restart, f.wrapped)
    if limit is not None:
        return Decision("stop", cause, step_code or 1, why, limit=limit,
                        detail=limit_text(limit, cause, count, restart))
    detail = budget_text(f.budget, cause, count, restart, f.wrapped)
    if cause in IN_PLACE and f.inplace.max:
        detail += "; not in place: " + ("the shrunk step failed" if shrink_failed
                                        else f.inplace.why_not())
    return Decision("requeue", cause, 0, why, detail=detail)
