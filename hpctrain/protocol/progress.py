"""A rank's progress record, typed: what each rank of ``hpctrain.runtime`` says of itself
heartbeat by heartbeat (:mod:`hpctrain.runtime.progress` writes it, the node's relay sends
it, the supervisor's board parses it once as it arrives, :mod:`hpctrain.supervisor.board`).

On the wire and on disk it stays a flat map of strings (``key=value`` lines in the node
directory, JSON rows in a datagram, :mod:`hpctrain.protocol.channel`); everything that
reads one goes through :meth:`Progress.parse`, and the writer through
:meth:`Progress.fields`, so the fields and their formats live here only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.protocol.dialog import Attempt, text

# phases a rank goes through (runtime.progress.phase): startup -> training, with save,
# restarting (its attempt failed: it waits for the supervisor's word), exiting (its work
# ended: the last word ``exit`` is said), exited (nothing left but the teardown)
FINAL_PHASES = ("exiting", "exited", "restarting")
# the fields whose change the supervisor must hear at once (not a step or a beat): a node's
# relay sends its records as soon as one of these changes (hpctrain.runtime.relay)
NEWS = ("rank", "restart_count", "attempt", "phase", "failed", "exit", "flushed", "inprocess",
        "wrapped")


UNITS = ("tokens", "samples")
MODES = ("train", "lora", "qlora", "inference")   # how FLOPs follow from params (planner)


@dataclass(frozen=True)
class Work:
    """What one training step does, all ranks together, as the script says it
    (``ctx.set_work``): ``report`` turns it into throughput and MFU."""

    per_step: float             # tokens or samples per optimizer step, every rank's together
    unit: str = "tokens"        # "tokens" | "samples"
    flops: float = 0.0          # model FLOPs per unit, when the script gives them (else 0)
    params: float = 0.0         # the model's parameter count, when known (FLOPs follow)
    mode: str = "train"         # with ``params``: 6 FLOPs per parameter and token to train

    def fields(self) -> dict[str, str]:
        """Its wire form, in a progress record and a history line (defaults left out)."""
        out = {"work": f"{self.per_step:g}", "work_unit": self.unit}
        if self.flops:
            out["work_flops"] = f"{self.flops:g}"
        if self.params:
            out.update(work_params=f"{self.params:g}", work_mode=self.mode)
        return out

    @classmethod
    def parse(cls, fields: Mapping[str, object]) -> Work | None:
        """The work ``fields`` carry; None without any (or when it is not a number)."""
        if not text(fields, "work"):
            return None
        try:
            work = cls(float(text(fields, "work")), text(fields, "work_unit") or "tokens",
                       float(text(fields, "work_flops") or 0),
                       float(text(fields, "work_params") or 0),
                       text(fields, "work_mode") or "train")
        except ValueError:
            return None
        ok = work.per_step > 0 and work.unit in UNITS and work.mode in MODES and \
            work.flops >= 0 and work.params >= 0
        return work if ok else None


@dataclass(frozen=True)
class Progress:
    """One rank's newest progress record."""

    rank: int
    address: Attempt          # the job run, the Slurm run and the attempt it belongs to
    changed_at: float         # when the phase or the step last changed (wall clock)
    beat_at: float            # when the rank last said anything (its heartbeat)
    node: str = ""
    pid: int = 0
    step: str = ""            # the script's step ("" before it says one)
    boundaries: int = 0       # step boundaries passed (the watchdog's pace)
    phase: str = "training"
    exit: str = ""            # how the script's work ended: return, crash, requeue
    flushed: bool | None = None   # after ``exit``: were all saves durable (None: not yet)
    inprocess: bool = False   # can restart in its own process (runtime.run)
    wrapped: bool = False     # its script's main runs under runtime.run (crashes retried)
    failed: str = ""          # this attempt failed: crash, hang, timeout, peer
    error: str = ""           # the failure, one line
    work: Work | None = None  # what a step does (tokens or samples), once the script says
    own: float = 0.0          # its own time per step, apart from waits for the others (s,
    #                           the median of its newest steps; 0: not measured yet)

    @classmethod
    def parse(cls, fields: Mapping[str, object]) -> Progress | None:
        """The record in ``fields`` (strings, or what JSON made of them); None when it is
        not one (no rank, or a clock or count that is not a number). A clock left out
        (``hpctrain status``'s summary has no beat) reads as 0."""
        def get(key: str) -> str:
            return text(fields, key)

        try:
            rank, address, flushed = get("rank"), Attempt.parse(fields), get("flushed")
            if not rank.isdigit() or address is None:
                return None
            return cls(
                rank=int(rank), address=address,
                changed_at=float(get("changed_at") or 0), beat_at=float(get("beat_at") or 0),
                node=get("node"), pid=int(get("pid") or 0), step=get("step"),
                boundaries=int(get("boundaries") or 0), phase=get("phase") or "training",
                exit=get("exit"), flushed=None if flushed == "" else flushed == "1",
                inprocess=get("inprocess") == "1", wrapped=get("wrapped") == "1",
                failed=get("failed"), error=get("error"),
                work=Work.parse(fields), own=max(float(get("own") or 0), 0.0))
        except ValueError:
            return None

    def fields(self) -> dict[str, str]:
        """The record as it is written and sent; fields at their defaults are left out
        (a heartbeat stays small: 8,192 ranks' last words share one receive buffer)."""
        out = {**self.address.fields(), "rank": str(self.rank), "node": self.node,
               "pid": str(self.pid), "step": self.step, "boundaries": str(self.boundaries),
               "phase": self.phase, "changed_at": f"{self.changed_at:.3f}",
               "beat_at": f"{self.beat_at:.3f}"}
        if self.exit:
            out["exit"] = self.exit
            out["flushed"] = "" if self.flushed is None else "1" if self.flushed else "0"
        if self.inprocess:
            out["inprocess"] = "1"
        if self.wrapped:
            out["wrapped"] = "1"
        if self.failed:
            out.update(failed=self.failed, error=self.error)
        if self.work is not None:
            out.update(self.work.fields())
        if self.own:
            out["own"] = f"{self.own:.6g}"
        return out

    @property
    def mark(self) -> tuple[int, int]:
        """How far it got, comparable between ranks."""
        return self.boundaries, int(self.step) if self.step.isdigit() else -1

    def newer_than(self, known: Progress) -> bool:
        """Should this record of a rank replace ``known``? A later or equal beat (datagrams
        may come out of order: a relay's beat after the rank's own word), or a later run
        or attempt (a clock step backwards must not hide a new attempt's word)."""
        run = (self.address.restart_count, self.address.attempt)
        return self.beat_at >= known.beat_at or \
            run > (known.address.restart_count, known.address.attempt)

    @property
    def final(self) -> bool:
        """Has the rank said its last word for this attempt (or wait for the next)?"""
        return self.phase in FINAL_PHASES
