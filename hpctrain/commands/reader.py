"""Whether anybody still reads our output: commands that wait with nothing to print
(``logs --follow`` of a quiet job, ``_serve wait`` for a ``--host`` client) end when
their reader goes, not at their next write, which may be hours later. Over ``--host``
this is what makes a client's Ctrl-C end the command on the cluster too: ssh closes the
channel, and the remote command's stdout loses its reader."""

from __future__ import annotations

import os
import select
import sys
import time


def wait_while_read(seconds: float) -> None:
    """Wait ``seconds``, but raise BrokenPipeError as soon as nobody reads our stdout.

    A follower with nothing to print would otherwise learn that its reader is gone only at
    its next write, which for a quiet job may be hours later: over ``--host``, every
    Ctrl-C would leave a ``logs --follow`` running on the cluster. The write end of a pipe
    or socket whose reader closed polls as POLLERR/POLLHUP; a terminal or file never does."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):   # replaced stdout (tests, notebooks)
        time.sleep(seconds)
        return
    poller = select.poll()
    poller.register(fd, 0)   # nothing asked for: only POLLERR, POLLHUP, POLLNVAL come back
    events = poller.poll(seconds * 1000)
    if any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events):
        raise BrokenPipeError(f"the reader of stdout (fd {fd}) has gone")
    if events:   # POLLNVAL: not a pollable descriptor; plain waiting
        time.sleep(seconds)


def reader_gone() -> int:
    """End quietly after BrokenPipeError: point stdout at /dev/null, so Python's flush at
    exit does not write to the dead pipe (and complain), and give the exit code of a
    command killed by SIGPIPE."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        pass
    return 141
