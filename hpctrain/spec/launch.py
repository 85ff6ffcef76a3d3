"""How a launcher starts the command: where a Python command's script ends, and
``[run] local_rank_arg``, the ``--local_rank=N`` argument DeepSpeed's own launcher passes.

DeepSpeed's launcher (``deepspeed train.py ...``) runs each rank as ``python -u train.py
--local_rank=N ARGS`` unless told ``--no_local_rank``: many DeepSpeed scripts declare the
argument (``parser.add_argument("--local_rank", type=int)``) and some require it. hpctrain
starts DeepSpeed's ranks through srun with ``LOCAL_RANK`` set (``deepspeed.init_distributed()``
reads it), and passes the argument only when the spec asks: a script that does not declare
it would fail on an unknown argument. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hpctrain.errors import SpecError

PYTHON = re.compile(r"(^|/)python[0-9.]*$")     # a command that starts a Python interpreter
# Python's own options that take a value as the next word (python -X dev, -W ignore)
_VALUED = ("-X", "-W", "-Q")


def is_python(command: Sequence[str]) -> bool:
    """Does ``command`` start a Python interpreter (``python``, ``/venv/bin/python3.11``)?"""
    return bool(command) and bool(PYTHON.search(command[0]))


def script_end(command: Sequence[str]) -> int:
    """How many words of ``command`` name the program, before its own arguments: after the
    script or ``-m module`` of a Python command (its interpreter options included), else
    after the program. Where DeepSpeed's launcher puts ``--local_rank``. A Python command
    without a script (or ``-c`` code) raises SpecError."""
    if not is_python(command):
        return 1
    i = 1
    while i < len(command) and command[i].startswith("-") and command[i] != "-":
        if command[i] in ("-m", "-c"):
            i += 1       # the module (or the code) is the program
            break
        i += 2 if command[i] in _VALUED else 1
    if i >= len(command):
        raise SpecError(f"run.command={list(command)!r} starts python without a script: "
                        "add the training script (or -m module) that takes --local_rank")
    return i + 1


def local_rank_arg(value: Any, launcher: str, command: Sequence[str]) -> bool:
    """``[run] local_rank_arg``: true passes ``--local_rank=<local rank>`` after the script
    of a ``deepspeed`` launcher's command, as DeepSpeed's launcher does."""
    if not isinstance(value, bool):
        raise SpecError(f"run.local_rank_arg={value!r} must be true or false")
    if value and launcher != "deepspeed":
        raise SpecError(f"run.local_rank_arg = true is for launcher = \"deepspeed\" (its own "
                        f"launcher passes --local_rank); under {launcher!r} the ranks read "
                        "LOCAL_RANK from the environment: leave it out")
    if value:
        script_end(command)     # a command it cannot be placed in is refused here
    return value
