"""Will it fit? The memory and layout planner behind ``hpctrain plan`` (pure, no torch).

``recommend(Request(Workload(...)), Hardware(...))`` returns a :class:`Recommendation`: ranked
candidate layouts with per-GPU memory term by term, the recommended one and why, and
a cost estimate; see docs/will-it-fit.md for the model and its sources.
"""

from hpctrain.planner.candidates import Candidate, Hardware
from hpctrain.planner.core import Recommendation, recommend
from hpctrain.planner.memory import Breakdown, Parallelism, Workload, breakdown
from hpctrain.planner.model import Arch, resolve_arch
from hpctrain.planner.search import Request

__all__ = ["Arch", "Breakdown", "Candidate", "Hardware", "Parallelism", "Recommendation", "Request",
           "Workload", "breakdown", "recommend", "resolve_arch"]
