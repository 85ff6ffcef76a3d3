"""The scale rehearsal in small, on the real devcluster (issue 36; the 64-node one is
benchmarks/rehearsal.py): 2 nodes x 2 torch-free stand-in ranks
(tests/programs/standin_rank.py: the runtime's real progress reporter and relay; a
recorded-behaviour stand-in for torch.distributed's all-reduce). One rank stops outside
the all-reduce, the others wait in it:

- the hang is found within hang_timeout_s + 5 s of its start, the rank named, the step
  restarted in the allocation, and the job completes;
- while it trains, the job's checkpoint directory (where its state directory lives, on
  shared storage) sees at most one file event a second: the progress went over the
  network, and the state directory holds no per-rank progress file;
- the node-local directories are gone once the ranks have left.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from hpctrain import protocol
from helpers.cluster import job_log, submit
from helpers.inotify import Inotify
from helpers.jobs import isolate
from helpers.jsonl import read_jsonl
from helpers.slurm import sacct_states, squeue_state
from helpers.specs import spec_toml

pytestmark = [pytest.mark.slurm]
PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "standin_rank.py"
HANG_TIMEOUT_S = 10


def events(root: Path) -> list[dict]:
    return read_jsonl(root / "events.jsonl")


def test_a_hang_among_stand_in_ranks_is_found_and_shared_storage_stays_quiet(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    (root / "ckpt").mkdir()
    command = [sys.executable, str(PROGRAM), "--steps", "60", "--step-s", "0.25",
               "--hang", "3:8", "--events", str(root / "events.jsonl")]
    job = submit(root, spec_toml(
        name="scale", partition="debug", nodes=2, gpus_per_node=2, time="00:10:00",
        output=f"{root}/job-%j.out", workdir=str(root), layout={"dp": 4},
        run={"launcher": "srun", "command": command}, checkpoint={"dir": str(root / "ckpt")},
        watchdog={"hang_timeout_s": HANG_TIMEOUT_S}))
    counter = Inotify(root / "ckpt")
    deadline, training = time.time() + 300, None
    while squeue_state(job) not in ("", "COMPLETED", "FAILED", "CANCELLED"):
        counter.read()
        starts = [e["time"] for e in events(root) if e["event"] == "start" and e["attempt"]]
        if starts and training is None:
            training = starts[0] + 2.0          # the restarted attempt, past its start-up
        assert time.time() < deadline, job_log(root, job)[-3000:]
        time.sleep(0.5)
    counter.read()
    log = job_log(root, job)
    assert sacct_states(job) == ["COMPLETED"], log[-3000:]
    assert "HANG: stopped first: rank(s) 3 on n2 (not in a collective while rank(s) 0-2 " \
           "wait in one" in log, log[-3000:]
    hang = next(e for e in events(root) if e["event"] == "hang")
    state = protocol.state_dir(root / "ckpt", job)
    ledger = (state / protocol.LEDGER).read_text()
    detected = float(re.search(r"restart cause=hang .*?detected_at=([\d.]+)", ledger)[1])
    assert 0 < detected - hang["time"] <= HANG_TIMEOUT_S + 5, (detected - hang["time"], ledger)
    # the restarted attempt trained 60 steps of 0.25 s: its quiet stretch, then its end
    assert training is not None
    rate = counter.rate(training, training + 10.0)
    assert rate <= 1.0, (rate, counter.names)
    assert not (state / protocol.PROGRESS).exists()
    run_id = protocol.read_record(state / protocol.IDENTITY)["run_id"]
    left = list(Path(f"/dev/shm/hpctrain-{os.getuid()}").glob(f"{run_id}-*"))
    assert left == [], [sorted(x.name for x in d.rglob("*")) for d in left]
