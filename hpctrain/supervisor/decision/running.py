"""Decisions while the allocation is in use, before the end-of-run table: what a stop
signal means and who must hear of it, a failed health check, which nodes are bad and
whether a requeued job can be kept off them. Pure (the supervisor asks Slurm and acts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.slurm.view import JobView
from hpctrain.supervisor.decision.facts import Decision, slurm_event

UNHEALTHY = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER")


@dataclass(frozen=True)
class StopResponse:
    """What to do about a stop signal the batch step caught while the step runs."""

    event: str                  # Slurm's word on the run (slurm_event)
    notice: str | None          # the cause to tell the ranks in the stop notice, if any
    decide_now: bool            # the time limit is reached: decide (and requeue) at once
    note_bad_nodes: bool        # Slurm requeued for a node failure: note the lost node now
    forward: str | None         # the signal to pass on to every rank; None: Slurm ends the
    #                             step itself, or a stop was already passed on


def notice_cause(caught: str, view: JobView | None, requeue_signal: str) -> str | None:
    """The cause a stop signal stands for when it arrives, for the stop notice the training
    processes read: preemption when Slurm is preempting the job, time_limit for the requeue
    signal (or a reached limit), None for anything else (a scancel)."""
    if view is not None and view.preempt_time is not None:
        return "preemption"
    if caught == requeue_signal or (view is not None and view.time_limit_reached):
        return "time_limit"
    return None


def respond_to_stop(caught: str, view: JobView | None, restart_count: int,
                    requeue_signal: str, step_signal: str, forwarded: bool,
                    acted: bool) -> StopResponse:
    """A stop signal while the step runs: tell the ranks why, then pass a stop on, once.
    When Slurm has already ended the run for its time limit, decide at once: KillWait may
    not outlast the ranks' emergency save. When Slurm ends the step itself (a requeue, a
    cancellation, the limit) nothing is passed on."""
    event = slurm_event(view, restart_count)
    passed_on = forwarded or event in ("requeued", "ended", "time_limit")
    return StopResponse(
        event=event, notice=notice_cause(caught, view, requeue_signal),
        decide_now=event == "time_limit" and not acted,
        note_bad_nodes=event == "requeued",
        forward=None if passed_on else ("TERM" if caught in ("TERM", "INT") else step_signal))


def unhealthy(state: str) -> bool:
    """Is a node in this Slurm state (``sinfo %T``) unfit to run on? ``*``: not responding."""
    return state.endswith("*") or any(word in state for word in UNHEALTHY)


def why_bad(state: str) -> str:
    """What a bad node is noted for: ``node_fail`` when it is down, else its state."""
    return "node_fail" if "DOWN" in state or state.endswith("*") else state.lower()


def exclusion(found: Mapping[str, str], excluded: set[str], partition: str,
              partition_nodes: set[str], needed: int) -> tuple[dict[str, str], str]:
    """The bad nodes ``found`` ({node: why}) to add to the job's ExcNodeList, and why some
    are not: none when the partition would keep fewer than ``needed`` nodes without them
    (a job that can never run again is worse than a bad node)."""
    nodes = {n: why for n, why in found.items() if n not in excluded}
    room = partition_nodes - excluded - set(nodes)
    if nodes and len(room) < needed:
        return {}, (f"not excluding {','.join(nodes)}: partition {partition} would keep "
                    f"{len(room)} node(s), the job needs {needed}")
    return nodes, ""


def health_check(failed: Mapping[str, str], leave_out: Mapping[str, str]) -> Decision:
    """The partition's health check failed on ``failed`` before the step started: requeue
    without those nodes (not counted against the budget) when they can be left out,
    else end the job and say why."""
    why = f"the partition's health check failed on {','.join(failed)}"
    if leave_out:
        return Decision("requeue", "health_check", 0, why,
                        detail="not counted against max_requeues")
    return Decision("finish", "health_check", 1,
                    f"{why}, and the job cannot be kept off it (the partition has no other "
                    "node for it, or watchdog.exclude_bad_nodes is off): ask the site to "
                    "drain the node")
