"""Will it fit? The memory and layout planner behind ``hpctrain plan`` (pure, no torch).

``make_plan(Request(Workload(...)), Hardware(...))`` returns a :class:`Plan`: ranked
candidate layouts with per-GPU memory term by term, the recommended one and why, and
a cost estimate; see docs/will-it-fit.md for the model and its sources.
"""

from hpctrain.planner.candidates import Candidate, Hardware
from hpctrain.planner.core import Plan, Request, make_plan
from hpctrain.planner.memory import Breakdown, Layout, Workload, breakdown
from hpctrain.planner.model import Arch, resolve_arch

__all__ = ["Arch", "Breakdown", "Candidate", "Hardware", "Layout", "Plan", "Request",
           "Workload", "breakdown", "make_plan", "resolve_arch"]
