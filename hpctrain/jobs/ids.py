"""Job ids as a user types them, checked in one place for every command that takes one
(cancel, status, logs, report) and for ``Job.attach``: a Slurm job id (``123``), an array
task (``123_4``), or a sweep's id (its first array's job id).

ASCII digits only, matched whole: Python's ``\\d`` also takes other scripts' digits and
``$`` allows a trailing newline, which Slurm would then be handed as an id.
"""

from __future__ import annotations

import re

from hpctrain.errors import JobIdError

_JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?")
MAX_LEN = 32     # Slurm's ids are 32-bit numbers: anything longer is not one


def check_job_id(text: str) -> str:
    """``text`` when it is a job id; else a :class:`JobIdError` naming it and the fix."""
    if len(text) <= MAX_LEN and _JOB_ID.fullmatch(text):
        return text
    shown = repr(text if len(text) <= MAX_LEN else text[:MAX_LEN] + "...")
    raise JobIdError(f"{shown} is not a job id: use 123, 123_4 (an array task) or a sweep "
                     "id that `hpctrain status` lists")
