"""A stand-in of the supervisor's side of in-process restarts, for runs without a scheduler
(unit tests; the GPU check on a machine with no Slurm). It is no more than the protocol's
records, answered as the real supervisor (``hpctrain/supervisor/inprocess.py``) answers
them: when a rank of the current attempt says it failed, every rank is asked to leave it
(``interrupt``); once every rank says it is restarting, ``go`` for the next attempt, or
``stop`` when a rank's process cannot start another (a device error) or ``answer`` says so.
The devcluster runs the real supervisor (tests/cluster/test_inprocess_cluster.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hpctrain import protocol as p

RUN_ID = "r1"


def records(state: Path, world: int) -> list[dict[str, str]]:
    """Every rank's progress record (a rank not yet started: an empty one)."""
    return [p.read_record(p.rank_file(state, p.PROGRESS, r)) for r in range(world)]


class StandIn:
    """Answers the ranks of one run (run id ``r1``, restart count 0) on a thread of its own;
    ``answered`` lists (attempt it answered for, when, each rank's ``failed`` word) and
    ``actions`` the words it said."""

    def __init__(self, state: Path, world: int, answer: str = "go") -> None:
        self.state, self.world, self.answer = state, world, answer
        self.attempt = 0
        self.answered: list[tuple[int, float, list[str]]] = []   # (attempt, when, words)
        self.actions: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        interrupted = -1
        while not self.done.wait(0.05):
            recs = records(self.state, self.world)
            now = [r for r in recs if r.get("attempt") == str(self.attempt)]
            waiting = [r for r in now if r.get("phase") == "restarting"]
            if waiting and interrupted != self.attempt:
                self.interrupt()
                interrupted = self.attempt
            if len(waiting) == self.world:
                # a rank whose process cannot start another attempt (a device error): stop
                able = all(r.get("inprocess") == "1" for r in now) and self.answer == "go"
                if able:
                    (self.state / p.EXIT).unlink(missing_ok=True)
                self.attempt += 1
                action = "go" if able else "stop"
                p.write_record(self.state / p.RESUME, {"run_id": RUN_ID, "restart_count": 0,
                                                       "attempt": self.attempt,
                                                       "action": action})
                self.actions.append(action)
                self.answered.append((self.attempt, time.time(),
                                      sorted(r.get("failed", "") for r in now)))

    def interrupt(self) -> None:
        p.write_record(self.state / p.INTERRUPT, {"run_id": RUN_ID, "restart_count": 0,
                                                  "attempt": self.attempt, "seq": time.time()})
