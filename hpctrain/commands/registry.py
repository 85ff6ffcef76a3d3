"""The table of hpctrain's commands: where each lives, its line in ``--help``, and which run
on a cluster with ``--host``. Plain data, read by :mod:`hpctrain.cli` at every start (so
cheap to import) and by :mod:`hpctrain.commands.remote`.
"""

from __future__ import annotations

from hpctrain.protocol import REMOTE_COMMAND

# name -> ("module:attribute", one-line help shown by `hpctrain --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "devcluster": ("hpctrain.commands.devcluster:devcluster", "Run a real SLURM cluster on this machine."),
    "render": ("hpctrain.commands.render:render", "Render a job spec to an sbatch script."),
    "templates": ("hpctrain.commands.templates:templates", "List, show and check partition templates."),
    "ckpt": ("hpctrain.commands.ckpt:ckpt", "List, verify and prune checkpoints."),
    "plan": ("hpctrain.commands.plan:plan", "Will it fit? Memory and layout planner."),
    "submit": ("hpctrain.commands.submit:submit", "Render a job spec and submit it (or --dry-run)."),
    "status": ("hpctrain.commands.status:status", "States of your jobs and sweeps (one Slurm call)."),
    "logs": ("hpctrain.commands.logs:logs", "Print or follow a job's output."),
    "report": ("hpctrain.commands.report:report", "Where a job's GPU-time went: runs, lost work, goodput."),
    "cancel": ("hpctrain.commands.cancel:cancel", "Cancel jobs, array tasks or sweeps."),
    "sweep": ("hpctrain.commands.sweep:sweep", "Submit a grid of overrides as one job array."),
}
# run on a cluster over SSH with --host (hpctrain.commands.remote); the others refuse it
REMOTE_COMMANDS = ("submit", "sweep", "status", "logs", "cancel", "report")
# not listed in --help: the cluster side of --host
HIDDEN = {"_serve": "hpctrain.commands.serve:serve"}
# the environment variable that sets --host
HOST_ENV = "HPCTRAIN_HOST"
# ...and --remote-command (its name shared with hpctrain.remote.ssh, which reads it too)
REMOTE_COMMAND_ENV = REMOTE_COMMAND
