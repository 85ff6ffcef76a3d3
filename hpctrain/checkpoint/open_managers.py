"""Every open checkpoint manager of this process, and closing them all as the process (or
an attempt of ``hpctrain.runtime.run``) ends: their in-flight saves made durable and their
root locks released before the runtime destroys the process group a save still needs.
"""

from __future__ import annotations

import atexit
import sys
import weakref
from typing import Any

_LIVE: weakref.WeakSet = weakref.WeakSet()   # every open manager of this process
_FAILED_AT_EXIT: list[str] = []   # saves that failed as the process left (close_all's report)


def register(manager: Any) -> None:
    """A new manager: closed by :func:`close_all`, and at the interpreter's exit."""
    atexit.register(_flush_at_exit, weakref.ref(manager))
    _LIVE.add(manager)


def close_all(leaving: bool = True) -> list[str]:
    """Close every open manager of this process (in-flight save durable, root lock
    released), printing what fails; every failure met so far as the process leaves, as
    messages (also one a manager's own flush at exit met). The runtime calls this before it
    destroys the process group that an in-flight save still needs, and again at exit:
    the second call closes nothing new and reports the same failures. ``leaving=False``:
    an attempt ends, not the process (hpctrain.runtime.run); its failures are not kept."""
    failed = []
    for mgr in list(_LIVE):
        try:
            mgr.close()
        except Exception as exc:  # noqa: BLE001 - reported, the next manager still closes
            failed.append(f"{mgr.root}: {exc}")
            print(f"hpctrain: checkpoint save failed before exit: {exc}", file=sys.stderr,
                  flush=True)
        if not leaving:
            _LIVE.discard(mgr)   # its process group is going: it is of no more use
    if leaving:
        _FAILED_AT_EXIT.extend(failed)
    return _FAILED_AT_EXIT[:] if leaving else failed


def _flush_at_exit(ref: weakref.ref) -> None:
    """Interpreter exit: finish the in-flight save; a failure is printed, not lost."""
    mgr = ref()
    if mgr is None:
        return
    try:
        mgr.close()
    except Exception as exc:  # noqa: BLE001 - nothing left to raise into at exit
        _FAILED_AT_EXIT.append(f"{mgr.root}: {exc}")
        print(f"hpctrain: checkpoint save failed at exit: {exc}", file=sys.stderr)
