"""A command waiting with nothing to print (``logs --follow`` of a quiet job, ``_serve
wait``) ends when its reader goes (``| head``, or a ``--host`` client's Ctrl-C closing the
ssh channel), not at its next write (:mod:`hpctrain.commands.reader`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

# a follower that has nothing to print: it waits up to 20 s, as for a quiet job
WAITER = """\
import sys, time
from hpctrain.commands.reader import wait_while_read
start = time.monotonic()
try:
    wait_while_read(20)
    print("waited", file=sys.stderr)
except BrokenPipeError:
    print(f"reader gone after {time.monotonic() - start:.1f} s", file=sys.stderr)
"""


def _waiter(stdout: int | object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WAITER], stdout=stdout,
                            stderr=subprocess.PIPE, text=True)


def test_the_wait_ends_as_soon_as_the_pipes_reader_closes() -> None:
    read_end, write_end = os.pipe()
    proc = _waiter(write_end)
    os.close(write_end)
    time.sleep(1.0)
    os.close(read_end)
    _, err = proc.communicate(timeout=15)
    assert err.startswith("reader gone after "), err
    assert float(err.split()[3]) < 5


def test_a_file_or_a_reader_that_stays_is_waited_for(tmp_path) -> None:
    with open(tmp_path / "out", "w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", WAITER.replace("20", "1")], stdout=fh,
                                stderr=subprocess.PIPE, text=True)
        assert proc.communicate(timeout=15)[1] == "waited\n"
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", WAITER.replace("20", "1")],
                            stdout=write_end, stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    try:
        assert proc.communicate(timeout=15)[1] == "waited\n"
    finally:
        os.close(read_end)
