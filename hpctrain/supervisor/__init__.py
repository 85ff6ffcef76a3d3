"""The job supervisor: the Python process that owns a job's batch step.

The rendered script does the site's setup (modules, environment, setup lines), then hands
over with ``exec python -m hpctrain.supervisor -- <launcher argv>``. The supervisor starts
the launcher (srun, torchrun, deepspeed) as its child, passes stop signals on in the way
each launcher needs, and when the step ends decides from Slurm's facts whether the job is
requeued (preemption, time limit, node loss), finished, or stopped by a requeue limit. It
keeps the job's state directory (ledger, stop notice, verdict; :mod:`hpctrain.protocol`).

Modules: ``config`` (what it is told), ``decision`` (every rule, pure: the end-of-run table,
the start of a run, stop signals, health checks and bad nodes, the budget), ``run`` (a thin
loop: gather raw facts, decide, act), ``scheduler`` (its one seam to Slurm, the step's
process and the clock), ``recorder`` (the one writer of the ledger and the verdict),
``statedir`` (the state directory), ``diagnosis`` (which rank failed first), ``finish``
(the ranks' last words), ``step`` (the child process and its environment), ``watchdog``
(the pure hang judgement) and ``hang`` (watching the ranks' progress, their stacks, killing
a hung step), ``nodes`` (bad nodes, exclusion), ``container`` (the OCI bundle), ``joblog``
(its lines in the job log). In-job code: it imports nothing from the submission side but
:mod:`hpctrain.slurm` (to ask Slurm), and never torch.
"""
