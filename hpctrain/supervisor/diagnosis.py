"""Which rank failed first, on which node, and with what error: read from what the
launcher reported, not guessed from the exit status.

Sources, best first: the runtime's crash record (rank, node, step, exception: only jobs
using ``hpctrain.runtime``); torchrun's root-cause report (rank, host, exit code, and
the traceback when the worker used torch's ``@record``); srun's ``task N: Exited with
exit code C`` line (the first failing task and its node); and the first Python exception
printed in this run's part of the job log (torch prefixes a rank's traceback with
``[rankN]:``). The parsing is pure; :func:`log_segment` reads the log from where the run's
step started.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass
from pathlib import Path

from hpctrain.protocol.records import ExitRecord

MAX_SEGMENT = 4 << 20   # bytes of this run's log read at most: the first failure is early

# slurmstepd's own words when Slurm ends a step for memory, in the step's output: the
# accounting poller (JobAcctGatherParams=OverMemoryKill) or the cgroup's OOM killer
_MEMORY_KILL = re.compile(r"^slurmstepd(?:-(?P<node>\S+))?: error: (?P<what>.*(?:exceeded memory "
                          r"limit|Exceeded (?:job|step) memory limit|oom-kill event).*)$")

_SRUN = re.compile(r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.+)$")
_RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")   # "ValueError: boom", "KeyboardInterrupt"
_FIELD = re.compile(r"^\s+(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
# torchrun's agent's own traceback: it reports a rank's failure, it is never the error
_LAUNCHER_ERRORS = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
                    "torch.distributed.elastic.multiprocessing.api.SignalException")
# lines the job log interleaves with a rank's traceback that are never its exception
_NOT_THE_RANKS = ("srun: ", "slurmstepd", "hpctrain: ")
# what a rank raises when a peer died under it: the consequence of a failure, never its cause
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "remote process exited", "NCCL communicator was aborted")
# srun names a task's fatal signal by strsignal(3)'s words
_SRUN_SIGNALS = {"Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
                 "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL",
                 "Killed": "SIGKILL", "Terminated": "SIGTERM"}
# what a C++ runtime prints when a std::thread is destroyed while joinable: torch's gloo
# process group (and its store) left to the interpreter's exit
ABORT_AT_EXIT = "terminate called without an active exception"
ABORT_AT_EXIT_FIX = (f"aborted at exit ('{ABORT_AT_EXIT}'): torch.distributed's process group "
                     "was left for the interpreter to tear down; call "
                     "torch.distributed.destroy_process_group() at the end of the script "
                     "(hpctrain.runtime.init() does it for you)")


@dataclass(frozen=True)
class Diagnosis:
    """The first failure of a run, as far as it is known."""

    rank: int | None = None
    node: str | None = None
    exit_code: str | None = None
    error: str | None = None   # the exception's last line: "ValueError: boom"
    source: str = ""           # runtime | torchrun | srun | log
    signal: str | None = None  # the rank died of this signal (SIGABRT), not by exiting

    def text(self) -> str:
        """``rank 3 on n2 (exit code 1): ValueError: boom``."""
        parts = []
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.node:
            parts.append(f"on {self.node}")
        if self.exit_code:
            parts.append(f"({self.exit_code})")
        head = " ".join(parts)
        if self.error:
            return f"{head}: {self.error}" if head else self.error
        return head


def log_segment(path: str, offset: int) -> str:
    """The job log from ``offset`` (where this run's step started), at most MAX_SEGMENT."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(MAX_SEGMENT).decode("utf-8", errors="replace")
    except OSError:
        return ""


def log_size(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def exceptions(text: str) -> list[tuple[int | None, str]]:
    """(rank or None, ``Type: message``) of every Python traceback's last line, in order."""
    found: list[tuple[int | None, str]] = []
    in_tb: dict[int | None, bool] = {}
    for raw in text.splitlines():
        m = _RANK_PREFIX.match(raw)
        rank = int(m.group("rank")) if m else None
        line = raw[m.end():] if m else raw
        if line.startswith("Traceback (most recent call last):"):
            in_tb[rank] = True
            continue
        if line.startswith(_NOT_THE_RANKS):
            continue    # Slurm's or hpctrain's own line, written between a traceback's lines
        if in_tb.get(rank) and line and not line[0].isspace():
            in_tb[rank] = False   # the first unindented line ends the traceback
            if _EXCEPTION.match(line) and not line.startswith(_LAUNCHER_ERRORS):
                found.append((rank, line.strip()[:300]))
    return found


def torchrun_root_cause(text: str) -> dict[str, str]:
    """The fields of torchrun's first ``Root Cause (first observed failure)`` block."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Root Cause (first observed failure):"):
            fields = {}
            for follow in lines[i + 1:i + 12]:
                m = _FIELD.match(follow)
                if m:
                    fields[m.group("key")] = m.group("value").strip()
                elif follow.startswith("====="):
                    break
            return fields
    return {}


def torchrun_hosts(text: str) -> dict[int, str]:
    """Rank -> host of every failure torchrun's report lists (``Failures:`` and the root
    cause)."""
    hosts: dict[int, str] = {}
    host = None
    for line in text.splitlines():
        m = _FIELD.match(line)
        if m and m.group("key") == "host":
            host = m.group("value").strip()
        elif m and m.group("key") == "rank" and host:
            rank = re.match(r"(\d+)", m.group("value"))
            if rank:
                hosts.setdefault(int(rank.group(1)), host)
    return hosts


def is_peer_lost(error: str) -> bool:
    """Is ``error`` what a rank raises when a peer died under it (a consequence)?"""
    return any(m in error for m in _PEER_LOST)


def _culprit(raised: list[tuple[int | None, str]], rank: int | None) -> tuple[int, str] | None:
    """Another rank's own error when ``rank`` (torchrun's root cause) only lost a peer:
    torchrun names the lowest rank among failures it observed in the same second (no
    error file: its timestamps are whole seconds), often a rank that died of the real
    culprit's exit."""
    own = [e for r, e in raised if r == rank]
    if not own or not is_peer_lost(own[0]):
        return None
    return next(((r, e) for r, e in raised if r is not None and r != rank and
                 not is_peer_lost(e)), None)


def memory_kill(text: str) -> str | None:
    """Slurm's first word that it ended the step for memory, with its node, or None:
    ``n2: StepId=12.0 exceeded memory limit (214884352 > 106954752), being killed``."""
    for line in text.splitlines():
        m = _MEMORY_KILL.match(line.strip())
        if m:
            return f"{m['node']}: {m['what']}" if m["node"] else m["what"]
    return None


def srun_failures(text: str) -> list[dict[str, str]]:
    """Every ``srun: error: NODE: task N: ...`` line of a task that failed on its own (not
    one srun terminated or killed after another failed), as fields, in order."""
    found = []
    for line in text.splitlines():
        m = _SRUN.match(line.strip())
        if m and "Terminated" not in m.group("what") and "Killed" not in m.group("what"):
            found.append(m.groupdict())
    return found


def srun_first_failure(text: str) -> dict[str, str]:
    """srun's first ``srun: error: NODE: task N: ...`` line, as fields."""
    failures = srun_failures(text)
    return failures[0] if failures else {}


def diagnose(segment: str, launcher: str, record: ExitRecord | None) -> Diagnosis | None:
    """The first failure of a run from the runtime's crash ``record`` (this run's, or
    None), then the launcher's report and the exceptions in the log ``segment``."""
    if record is not None and record.cause == "user_crash" and record.error:
        rank = record.rank if record.rank is not None and record.rank >= 0 else None
        return Diagnosis(rank, record.node or None,
                         None if record.exit_code is None else f"exit code {record.exit_code}",
                         record.error, "runtime")
    raised = exceptions(segment)
    root = torchrun_root_cause(segment) if launcher == "torchrun" else {}
    srun = srun_first_failure(segment)
    if root:
        m = re.match(r"(\d+)", root.get("rank", ""))
        rank = int(m.group(1)) if m else None
        code = root.get("exitcode", "").split(" (pid")[0].strip()
        tb = root.get("traceback", "")
        error = None if not tb or tb.startswith(("To enable traceback", "Signal ")) \
            else tb[:300]
        died_of = _signal_of_code(code)
        culprit = None if error else _culprit(raised, rank)
        if culprit is not None:
            rank, error = culprit
            host = torchrun_hosts(segment).get(rank)
            return Diagnosis(rank, srun.get("node") or host, None, error, "torchrun")
        error = error or _first_error(raised, rank, _abort_hint(segment, died_of))
        # srun names the node as Slurm does (torchrun's host is the machine's hostname)
        node = srun.get("node") or root.get("host") or None
        return Diagnosis(rank, node, f"exit code {code}" if code else None, error, "torchrun",
                         died_of)
    if srun:
        task = int(re.match(r"\d+", srun["tasks"]).group(0))  # type: ignore[union-attr]
        rank = task if launcher != "torchrun" else None       # torchrun: a task is a node
        died_of = _SRUN_SIGNALS.get(srun["what"].strip().split(" (")[0])
        return Diagnosis(rank, srun["node"], srun["what"].strip().lower(),
                         _first_error(raised, rank, _abort_hint(segment, died_of)), "srun",
                         died_of)
    if raised:
        rank, error = raised[0]
        return Diagnosis(rank, None, None, error, "log")
    if ABORT_AT_EXIT in segment:
        return Diagnosis(error=ABORT_AT_EXIT_FIX, source="log", signal="SIGABRT")
    return None


def _signal_of_code(code: str) -> str | None:
    """torchrun's ``-6`` (a worker killed by signal 6) -> ``SIGABRT``; None for an exit code."""
    if code.startswith("-") and code[1:].isdigit():
        try:
            return _signal.Signals(int(code[1:])).name
        except ValueError:
            return f"signal {code[1:]}"
    return None


def _abort_hint(segment: str, died_of: str | None) -> str | None:
    """The likely cause and fix of an abort at exit with no exception printed."""
    return ABORT_AT_EXIT_FIX if died_of == "SIGABRT" and ABORT_AT_EXIT in segment else None


def _first_error(raised: list[tuple[int | None, str]], rank: int | None,
                 hint: str | None) -> str | None:
    """The exception rank ``rank`` printed, else the ``hint`` (what its death suggests),
    else the first exception printed at all (another rank's, often a consequence)."""
    return next((e for r, e in raised if r == rank and r is not None), None) or hint or \
        next((e for _, e in raised), None)
