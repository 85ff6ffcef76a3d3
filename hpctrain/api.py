"""The Python API (notebooks): submit a spec, a callable, or a sweep; get :class:`~hpctrain.jobs.handle.Job` handles.

    import hpctrain
    spec = hpctrain.JobSpec.load("job.toml").with_overrides({"nodes": 2})
    job = hpctrain.submit(spec)                       # job.job_id, job.state, job.wait()
    job = hpctrain.submit_function(fn, 3, partition="debug", nodes=2, gpus_per_node=2,
                                   layout=hpctrain.Layout(tp=2))
    job.result()                                      # one value per rank

A facade: the work is done in :mod:`hpctrain.jobs.submit`. Importing it is cheap;
submitit is imported when something is submitted.
"""

from __future__ import annotations

from hpctrain.jobs.handle import Job
from hpctrain.jobs.submit import (Sweep, prepare, render_sweep, submit, submit_function,
                                  submit_sweep, sweep_specs)
# Pickles of function jobs submitted before 0.2 name these classes here; a job requeued
# after an upgrade unpickles them from this module.
from hpctrain.runtime.function import CheckpointableRankCall, RankCall
from hpctrain.spec.model import JobSpec, LayoutSpec

# What the user writes: hpctrain.Layout(tp=2) (pp=1, dp derived): the spec's [layout] table.
Layout = LayoutSpec

__all__ = ["CheckpointableRankCall", "Job", "JobSpec", "Layout", "RankCall", "Sweep", "prepare",
           "render_sweep", "submit", "submit_function", "submit_sweep", "sweep_specs"]
