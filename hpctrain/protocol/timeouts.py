"""The clocks of the in-process restart dialog, both sides in one place, because they
must nest (tests/unit/test_timeouts.py checks it):

- a rank whose attempt failed waits for the supervisor's word (``RESUME_WAIT_S``) longer
  than the supervisor may take to hear every rank arrive (``ARRIVE_S``) and to decide
  (``DECIDE_S``: it asks Slurm for the job and its nodes, each bounded by the Slurm
  client's timeout);
- ranks told to stop leave within ``LEAVE_S`` (their exception goes on and the launcher
  ends the step), else the supervisor kills the step;
- the rank's own waits are short polls of the word it expects.

A rank that gives up waiting leaves as if told to stop: its process ends and the
supervisor judges the step by how it ended, never by a word it did not send.
"""

from __future__ import annotations

# the supervisor's side (hpctrain.supervisor.inprocess)
ARRIVE_S = 15.0        # every rank of a failed attempt reports within this, or none restarts
ARRIVE_POLL_S = 0.1
DECIDE_S = 60.0        # the decision once they arrived: two Slurm queries at most, 30 s each
LEAVE_S = 30.0         # ranks told to stop leave within this, else the step is killed

# the rank's side (hpctrain.runtime.restart)
RESUME_POLL_S = 0.05   # how often a rank waiting to restart looks for the word
RESUME_WAIT_S = 120.0  # ...and how long, before it gives up and leaves
ABORT_EVERY_S = 0.25   # an interrupted attempt's groups are aborted this often
SIGNAL_AFTER_S = 1.0   # ...and its main thread signalled after this long


def nested() -> list[str]:
    """What breaks the nesting above (empty when the clocks agree)."""
    broken = []
    if RESUME_WAIT_S <= ARRIVE_S + DECIDE_S:
        broken.append(f"RESUME_WAIT_S={RESUME_WAIT_S} must exceed ARRIVE_S + DECIDE_S = "
                      f"{ARRIVE_S + DECIDE_S}: a rank would leave while the supervisor decides")
    if not RESUME_POLL_S < ARRIVE_POLL_S < ARRIVE_S:
        broken.append("polls must be shorter than the waits they serve")
    if not ABORT_EVERY_S < SIGNAL_AFTER_S < ARRIVE_S:
        broken.append("an interrupted rank must be aborted and signalled well within ARRIVE_S")
    return broken
