"""The exit-path matrix on the real devcluster (issue 31): script kind x exit x launcher.

A job that did its work is never reported failed, and a job that failed is reported as it
ended. Script kinds (tests/programs/): a loop written against hpctrain.runtime that closes
everything itself (runtime_steps.py); docs/fault-recovery.md's ten lines, which close
nothing (ten_lines.py); a plain torchrun DDP script (ddp_snapshot.py) and a plain DeepSpeed
script (plain_deepspeed.py), which never heard of hpctrain; and a function job
(``hpctrain.submit_function``). Exits (tests/programs/exit_paths.py): a normal return,
``sys.exit(0)``, an exception on rank 1 after the work, an abort of rank 1 at interpreter
exit (a stand-in for torch's gloo abort), the time-limit warning while the ranks leave, and
``exit_for_requeue`` after the warning mid-run (runtime scripts only: a plain script's
requeue is tests/cluster/test_supervisor_cluster.py's). Launchers: srun and torchrun (the
function job: srun, as submitit runs it).

Each cell is one job of 1 node x 2 ranks: a script kind under one launcher is one
``hpctrain sweep`` over ``run.env.EXIT_PATH`` (every cell its own array task, with its own
checkpoint dir and Slurm state), and every sweep is submitted before any is waited for, so
the two debug nodes stay busy. The natural abort comes in about 1 exit of 4, so the ten
lines' normal exit runs 4 more times (and 12 times without Slurm in
tests/unit/test_runtime_exit.py). Each cell asserts Slurm's state, ``hpctrain status``'s
state and cause, and that the last checkpoint is there and whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import hpctrain
from hpctrain.supervisor.diagnosis import ABORT_AT_EXIT_FIX
from helpers.cluster import events, status
from helpers.jobs import isolate
from helpers.slurm import sacct_states, wait_until
from helpers.specs import spec_toml
from programs import function_steps

# the matrix's ~50 jobs all run in its fixture (the first case's time): ~6 minutes alone,
# 10-11 beside the other workers' heaviest files on a 2-core machine, once past 15 (the
# suite starts its longest files together)
pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(1800)]
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
TESTS_ON_PATH = {"PYTHONPATH": f"{PROGRAMS.parent}"}
STEPS = 6          # saved at 3 and 6: the last save is the end of the work
RUNTIME_EXITS = ("normal", "sys_exit", "raise", "abort", "teardown_signal", "requeue")
PLAIN_EXITS = ("normal", "sys_exit", "raise", "abort", "teardown_signal")
ERROR = "RuntimeError: simulated failure after the last step"


@dataclass(frozen=True)
class Group:
    """One script kind under one launcher: one sweep, a cell per exit (x trials)."""

    kind: str          # runtime | ten_lines | ddp | deepspeed
    launcher: str
    exits: tuple[str, ...]
    trials: int = 1

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.launcher}" + (f"-x{self.trials}" if self.trials > 1 else "")

    @property
    def runtime(self) -> bool:
        return self.kind in ("runtime", "ten_lines")

    def command(self) -> list[str]:
        script = {"runtime": "runtime_steps.py", "ten_lines": "ten_lines.py",
                  "ddp": "ddp_snapshot.py", "deepspeed": "plain_deepspeed.py"}[self.kind]
        args = {"runtime": ["--steps", str(STEPS), "--step-sleep", "0.2"],
                "ddp": ["--epochs", str(STEPS), "--save-every", "3", "--epoch-sleep", "0.2"]}
        return [sys.executable, str(PROGRAMS / script), *args.get(self.kind, [])]

    def spec(self, root: Path) -> str:
        # every point's paths follow its own checkpoint dir (the sweep gives each one)
        setup = ['export EVENTS="$HPCTRAIN_CKPT_DIR/events.jsonl" '
                 'SNAPSHOT="$HPCTRAIN_CKPT_DIR/snapshot.pt" CKPT_DIR="$HPCTRAIN_CKPT_DIR"']
        return spec_toml(
            name=f"exit-{self.name}", partition="debug", nodes=1, gpus_per_node=2,
            time="00:10:00", output=f"{root}/job-%A_%a.out", workdir=str(root),
            run={"launcher": self.launcher, "command": self.command(), "setup": setup,
                 "env": {"OMP_NUM_THREADS": "1", "STEPS": str(STEPS), "DS_ACCELERATOR": "cpu"}},
            requeue={"max_requeues": 3, "signal": "USR1" if self.runtime else "USR2",
                     "signal_lead_s": 30},
            checkpoint={"dir": f"{root}/ckpt", "interval_steps": 3})   # ten_lines' saves

    def grid(self) -> list[str]:
        grid = ["--grid", "run.env.EXIT_PATH=" + ",".join(self.exits)]
        if self.trials > 1:
            grid += ["--grid", "run.env.TRIAL=" + ",".join(map(str, range(self.trials)))]
        return grid


GROUPS = (Group("runtime", "srun", RUNTIME_EXITS), Group("runtime", "torchrun", RUNTIME_EXITS),
          Group("ten_lines", "srun", RUNTIME_EXITS), Group("ten_lines", "torchrun", RUNTIME_EXITS),
          Group("ten_lines", "srun", ("normal",), trials=4),
          Group("ddp", "torchrun", PLAIN_EXITS), Group("ddp", "srun", PLAIN_EXITS),
          Group("deepspeed", "torchrun", PLAIN_EXITS), Group("deepspeed", "srun", PLAIN_EXITS))
FUNCTION_EXITS = ("normal", "raise", "abort", "teardown_signal", "requeue")


@dataclass
class Cell:
    """One job of the matrix, once it has ended."""

    group: str
    exit: str
    job_id: str
    ckpt: Path
    row: dict[str, Any]          # hpctrain status --json's row
    states: list[str]            # sacct's, oldest run first

    def __str__(self) -> str:
        return f"{self.group}/{self.exit} (job {self.job_id})"


def run(*argv: str) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "hpctrain", *argv, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def settled(row: dict[str, Any]) -> bool:
    return row["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


@pytest.fixture(scope="module")
def matrix(cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], list[Cell]]:
    """Every cell, submitted at once and waited for: (group name, exit) -> its jobs."""
    mp = pytest.MonkeyPatch()
    base = isolate(mp, tmp_path_factory.mktemp("exit"), shared=True)
    try:
        sweeps, functions = {}, {}
        for group in GROUPS:
            root = base / group.name
            root.mkdir()
            (root / "job.toml").write_text(group.spec(root))
            sub = run("sweep", str(root / "job.toml"), *group.grid(), "--max-parallel", "2")
            sweeps[group] = (sub["sweep_id"], root)
        for exit_path in FUNCTION_EXITS:
            ckpt = base / "function" / exit_path
            ckpt.mkdir(parents=True)
            env = {**TESTS_ON_PATH, "EXIT_PATH": exit_path, "CKPT_DIR": str(ckpt),
                   "OMP_NUM_THREADS": "1"}
            job = hpctrain.submit_function(
                function_steps.train, STEPS, partition="debug", nodes=1, gpus_per_node=2,
                time="00:10:00", name=f"exit-fn-{exit_path}", env=env)
            functions[exit_path] = (job, ckpt)

        def rows(sweep_id: str) -> list[dict[str, Any]]:
            return run("status", sweep_id)["jobs"]
        for group, (sweep_id, _) in sweeps.items():
            wait_until(lambda: all(settled(r) for r in rows(sweep_id)), 1500,
                       f"sweep {group.name} to end", interval_s=3)
        for exit_path, (job, _) in functions.items():
            wait_until(lambda: settled(status(job.job_id)), 300,
                       f"function job {exit_path} to end", interval_s=2)
        cells: dict[tuple[str, str], list[Cell]] = {}
        for group, (sweep_id, root) in sweeps.items():
            for row in rows(sweep_id):
                exit_path = row["point"]["run.env.EXIT_PATH"]
                index = int(row["job_id"].split("_")[1])
                ckpt = root / "ckpt" / f"point-{index:03d}"
                cells.setdefault((group.name, exit_path), []).append(
                    Cell(group.name, exit_path, row["job_id"], ckpt, row,
                         sacct_states(row["job_id"])))
        for exit_path, (job, ckpt) in functions.items():
            cell = Cell("function", exit_path, job.job_id, ckpt, status(job.job_id),
                        sacct_states(job.job_id))
            if cell.row["state"] == "COMPLETED":   # every rank's return value came back
                cell.row["results"] = job.result(timeout_s=30)
            cells[("function", exit_path)] = [cell]
        yield cells
    finally:
        mp.undo()


# ---- what each cell must show ----------------------------------------------------------------
def last_step(cell: Cell, kind: str) -> int | None:
    """The step of the cell's newest checkpoint, read as its kind writes it; a torn or
    unverifiable one fails here."""
    if kind == "ddp":
        import torch

        return torch.load(cell.ckpt / "snapshot.pt")["epochs_run"]
    if kind == "deepspeed":
        return int((cell.ckpt / "latest").read_text().strip().removeprefix("global_step"))
    res = subprocess.run([sys.executable, "-m", "hpctrain", "ckpt", "verify", str(cell.ckpt)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"{cell}: {res.stdout}{res.stderr}"
    return int((cell.ckpt / "latest").read_text().strip().removeprefix("step_"))


def check_runtime_cell(cell: Cell, launcher: str) -> None:
    row, verdict = cell.row, cell.row["verdict"]
    if cell.exit == "raise":
        assert cell.states == ["FAILED"] and row["cause"] == "user_crash", (cell, row)
        assert (verdict["rank"], verdict["error"]) == ("1", ERROR), (cell, verdict)
        return
    assert cell.states[-1] == "COMPLETED" and row["state"] == "COMPLETED", (cell, row)
    assert row["cause"] == "completed", (cell, verdict)
    if cell.exit == "abort":
        assert verdict["detail"] == "rank 1 then died at exit (SIGABRT)", (cell, verdict)
        assert run("report", cell.job_id)["note"] == verdict["detail"], cell
    elif cell.exit == "teardown_signal" and launcher == "torchrun":
        # torchrun's agent takes the warning as TERM and ends the finished ranks: nothing
        # was left to save, so no requeue either; a rank torn down by it may die of gloo's
        # abort (its own signal named after the stop)
        assert verdict["detail"].startswith(
            "the stop (SIGUSR1) then ended the step as they left"), (cell, verdict)
    else:
        assert verdict["detail"] == "", (cell, verdict)
    want = {"time_limit": 1} if cell.exit == "requeue" else {}
    assert row["requeues"] == want and len(cell.states) == 1 + len(want), (cell, row)


def check_plain_cell(cell: Cell) -> None:
    """A script without the runtime: reported as it ended. Its own exit may abort (1 in 4
    for a process group left to the interpreter): then FAILED, with the cause and fix."""
    row, verdict = cell.row, cell.row["verdict"]
    if cell.exit == "raise":
        assert cell.states == ["FAILED"] and row["cause"] == "user_crash", (cell, row)
        assert "RuntimeError" in (verdict.get("error") or ""), (cell, verdict)
        return
    if cell.exit == "abort" or row["state"] == "FAILED":
        assert row["state"] == "FAILED" and row["cause"] == "user_crash", (cell, row)
        assert verdict["error"] == ABORT_AT_EXIT_FIX, (cell, verdict)
        return
    assert row["state"] == "COMPLETED" and row["cause"] == "completed", (cell, row)
    # the warning kills a plain script as it leaves: requeued, and the next run finds the
    # work done
    want = {"time_limit": 1} if cell.exit == "teardown_signal" else {}
    assert row["requeues"] == want, (cell, row)


@pytest.mark.parametrize("group", GROUPS, ids=[g.name for g in GROUPS])
def test_every_exit_of_every_script_kind_is_reported_as_it_happened(
        matrix: dict[tuple[str, str], list[Cell]], group: Group) -> None:
    for exit_path in group.exits:
        cells = matrix[(group.name, exit_path)]
        assert len(cells) == group.trials
        for cell in cells:
            if group.runtime:
                check_runtime_cell(cell, group.launcher)
            else:
                check_plain_cell(cell)
            assert last_step(cell, group.kind) == STEPS, cell
            # the work itself ran to its end (ddp_snapshot.py calls that event "done")
            assert events(cell.ckpt, "end") or events(cell.ckpt, "done"), cell


def test_a_function_job_leaves_as_a_script_does(
        matrix: dict[tuple[str, str], list[Cell]]) -> None:
    for exit_path in FUNCTION_EXITS:
        (cell,) = matrix[("function", exit_path)]
        check_runtime_cell(cell, "srun")
        assert last_step(cell, "runtime") == STEPS, cell
        if exit_path != "raise":
            assert [r["w"] for r in cell.row["results"]] == [STEPS, STEPS], cell
