"""The defaults of the job's fault-tolerance settings, written once: the spec applies them
when a table leaves a key out (``hpctrain.spec.model`` ``RequeueSpec``/``WatchdogSpec``,
``hpctrain.spec.partitions`` ``Partition``), and the supervisor falls back on them when its
variables are unset (a script run by hand: ``hpctrain.supervisor.config``).
tests/unit/test_defaults.py pins that both sides agree.

``max_crash_restarts`` has no number here on purpose: left out, the supervisor chooses by
the script's kind (``hpctrain.supervisor.decision.budget``), and the spec says nothing.
"""

from __future__ import annotations

MAX_REQUEUES = 10            # [requeue] max_requeues: every cause together
# max_preemptions, max_time_limits: the total; max_node_failures, max_storage_retries,
# max_hangs: this many, at most the total (capped_limit)
CAPPED_CAUSE_LIMIT = 3
REQUEUE_SIGNAL = "USR2"      # [requeue] signal: the time-limit warning
MAX_STEP_RESTARTS = 2        # [watchdog] max_step_restarts: in the allocation, whole job
EXCLUDE_BAD_NODES = True     # [watchdog] exclude_bad_nodes
HEALTH_CHECK_TIMEOUT_S = 120  # a partition's health_check_timeout_s
# [health]: a node is slow at SLOW_FACTOR times the others' own time per step for
# SLOW_FOR_S (no alarm in any job of the test suite; a node at half speed named in ~20 s)
SLOW_FACTOR = 1.5
SLOW_FOR_S = 15.0


def capped_limit(total: int) -> int:
    """The default of a cause limited to a few requeues (node failures, storage, hangs)."""
    return min(CAPPED_CAUSE_LIMIT, total)
