"""Stop signals: the handler only records that a signal came.

Saving inside a signal handler is the classic failure: the handler runs between
two bytecodes of whatever the main thread was doing (maybe halfway through an
optimizer step or a collective), so the state it would save is torn, and a
collective started there deadlocks the other ranks. Here the handler sets a flag;
the training loop looks at it at a step boundary, all ranks agree
(:meth:`hpctrain.runtime.Context.stop_requested`), and only then is anything saved.

USR2 is the default time-limit signal: USR1 is used by NCCL's debug dump hooks.
SIGTERM is what Slurm sends on preemption (then SIGKILL after GraceTime).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any

DEFAULT_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)


def parse_signals(spec: str) -> tuple[int, ...]:
    """``"USR2,TERM"`` or ``"SIGUSR2 15"`` -> signal numbers; ValueError names a bad one."""
    out = []
    for word in spec.replace(",", " ").split():
        if word.isdigit():
            out.append(signal.Signals(int(word)))
            continue
        name = word.upper() if word.upper().startswith("SIG") else "SIG" + word.upper()
        try:
            out.append(signal.Signals[name])
        except KeyError:
            raise ValueError(f"unknown signal {word!r} in {spec!r}: use names like USR2,TERM"
                             ) from None
    return tuple(out)


class StopFlag:
    """Records the first stop signal received (and how many came) without acting on it."""

    def __init__(self) -> None:
        self.signum: int = 0  # first stop signal received; 0 = none
        self.received_at: float | None = None  # wall clock of the first one
        self.count: int = 0
        self._previous: dict[int, Any] = {}

    def __bool__(self) -> bool:
        return self.signum != 0

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # Only set fields: nothing that allocates a lock, logs or does I/O.
        if not self.signum:
            self.signum = signum
            self.received_at = time.time()
        self.count += 1

    def install(self, signals: Iterable[int] = DEFAULT_SIGNALS) -> StopFlag:
        """Route ``signals`` to the flag (main thread only, a Python rule)."""
        for sig in signals:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def claim(self) -> None:
        """Route the installed signals to the flag again: a framework that set its own
        handlers after :meth:`install` (Lightning's SIGTERM handler, say) no longer gets
        them. Main thread only; what was there before :meth:`install` is still restored
        by :meth:`uninstall`."""
        for sig in self._previous:
            signal.signal(sig, self._handler)

    def uninstall(self) -> None:
        """Restore the handlers that were there before :meth:`install`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def clear(self) -> None:
        self.signum, self.received_at, self.count = 0, None, 0
