"""Talking to SLURM: one runner for its binaries, one parser per output format, one state table.

``client`` is the only module that starts SLURM client binaries (argv lists, timeouts,
typed errors). Checkpoint and in-job code never import this package.
"""
