"""Rendered scripts executed by real bash, with srun/scontrol/lfs replaced by stand-ins.

Shell safety: a hostile value in any user field is either refused (SpecError) or
reaches the program byte for byte without being executed (the payloads would create
a marker file). Also: the Lustre branch, setup lines, and the signal/requeue block.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from hpctrain.errors import SpecError
from hpctrain.render import render_script
from hpctrain.spec import JobSpec
from shell_standins import kill_group, run_script, start_script

PAYLOADS = [
    "$(touch {m})", "`touch {m}`", "'; touch {m}; '", '"; touch {m}; "', "x; touch {m}",
    "x\ntouch {m}", "x\rtouch {m}", "$(touch${{IFS}}{m})", "'\"$(touch {m})\"'",
    "\\'; touch {m} #", "ünïcödé ✓ 🚀 $(touch {m})", "x && touch {m}", "x | touch {m}",
    "$((1))`touch {m}`", "x\n#SBATCH --wrap=touch {m}", "--output=$(touch {m})",
    "${{PATH:0:0}}$(touch {m})", "x\u2028$(touch {m})", "*; touch {m}",
]


def base(tmp: Path, launcher: str = "srun") -> dict[str, Any]:
    return {"name": "hostile", "partition": "debug", "nodes": 1, "time": "00:10:00",
            "run": {"launcher": launcher, "command": [str(tmp / "standin-bin" / "argv-recorder")]},
            "requeue": {"signal_lead_s": 30}}


def setter(path: str) -> Callable[[dict, str], None]:
    """Put a value at a dotted path of a spec dict (lists: append as an argument)."""
    def put(d: dict, value: str) -> None:
        *parents, last = path.split(".")
        node = d
        for p in parents:
            node = node.setdefault(p, {})
        if last == "command":
            node[last] = [*node[last], value]
        else:
            node[last] = value
    return put


FIELDS = ["name", "partition", "time", "account", "qos", "constraint", "exclude",
          "reservation", "mail", "mail_type", "output", "workdir", "run.command",
          "run.launcher", "run.env.SAFE_NAME", "checkpoint.dir", "requeue.signal",
          "sbatch.comment", "sbatch.mem"]


@pytest.mark.parametrize("field", FIELDS)
def test_hostile_values_are_refused_or_inert(tmp_path: Path, field: str) -> None:
    marker = tmp_path / "PWNED"
    executed = refused = 0
    for template in PAYLOADS:
        payload = template.format(m=marker)
        if field == "checkpoint.dir":
            payload = f"{tmp_path}/ckpt-{payload}"
        data = base(tmp_path)
        setter(field)(data, payload)
        try:
            script = render_script(JobSpec.from_dict(data))
        except SpecError:
            refused += 1
            continue
        run = run_script(script, tmp_path)
        assert not marker.exists(), f"{field}={payload!r} was executed"
        assert run.returncode == 0, run.stderr
        executed += 1
        if field == "run.command":
            assert run.nul_list("command.argv") == [payload]
        if field == "run.env.SAFE_NAME":
            env = dict(e.split("=", 1) for e in run.nul_list("command.env"))
            assert env["SAFE_NAME"] == payload
        if field == "checkpoint.dir":
            assert Path(payload).is_dir()
            env = dict(e.split("=", 1) for e in run.nul_list("command.env"))
            assert env["HPCTRAIN_CKPT_DIR"] == payload
    if field in ("run.command", "run.env.SAFE_NAME"):
        assert refused == 0       # free text: every payload is carried, none is run
    elif field == "checkpoint.dir":
        assert refused == sum("\n" in p or "\r" in p for p in PAYLOADS) and executed > 0
    else:
        assert executed == 0      # names, directives, enums: every payload is refused


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_hostile_arguments_reach_every_launcher_verbatim(tmp_path: Path, launcher: str) -> None:
    marker = tmp_path / "PWNED"
    args = [p.format(m=marker) for p in PAYLOADS]
    data = base(tmp_path, launcher)
    data["run"]["command"] = ["python3", "train.py", *args] if launcher == "torchrun" else \
        [data["run"]["command"][0], *args]
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path,
                     STANDIN_SRUN_MODE="record" if launcher == "torchrun" else "exec")
    assert run.returncode == 0, run.stderr
    assert not marker.exists()
    srun_argv = run.nul_list("srun.argv")
    assert srun_argv[-len(args):] == args
    if launcher == "torchrun":
        assert srun_argv[3:6] == ["python3", "-m", "torch.distributed.run"]
        assert "--rdzv_endpoint=n1:24242" in srun_argv   # first node, port from the job id
    else:
        assert run.nul_list("command.argv") == args
        env = dict(e.split("=", 1) for e in run.nul_list("command.env"))
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("0", "0", "1")
        assert (env["CROSS_RANK"], env["LOCAL_SIZE"], env["MASTER_ADDR"]) == ("0", "2", "n1")


def test_nul_bytes_are_refused_everywhere(tmp_path: Path) -> None:
    for field in FIELDS:
        data = base(tmp_path)
        setter(field)(data, "a\0b")
        with pytest.raises(SpecError):
            JobSpec.from_dict(data)


def test_layout_and_env_reach_the_ranks(tmp_path: Path) -> None:
    data = base(tmp_path)
    data.update(nodes=2, layout={"tp": 2}, checkpoint={"dir": str(tmp_path / "ck"),
                                                       "interval_steps": 7, "keep_last": 2})
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path)
    env = dict(e.split("=", 1) for e in run.nul_list("command.env"))
    assert {k: env[k] for k in ("HPCTRAIN_TP", "HPCTRAIN_PP", "HPCTRAIN_DP", "HPCTRAIN_WORLD_SIZE",
                                "HPCTRAIN_CKPT_INTERVAL_STEPS", "HPCTRAIN_CKPT_KEEP_LAST",
                                "MASTER_ADDR", "MASTER_PORT", "HPCTRAIN_PREEMPTIBLE")} == {
        "HPCTRAIN_TP": "2", "HPCTRAIN_PP": "1", "HPCTRAIN_DP": "2", "HPCTRAIN_WORLD_SIZE": "4",
        "HPCTRAIN_CKPT_INTERVAL_STEPS": "7", "HPCTRAIN_CKPT_KEEP_LAST": "2",
        "MASTER_ADDR": "n1", "MASTER_PORT": str(20000 + 4242 % 10000), "HPCTRAIN_PREEMPTIBLE": "1"}
    assert "CUDA_VISIBLE_DEVICES" not in env   # nothing relies on it (fake GPUs)


def test_checkpoint_dir_without_lfs_is_created_silently(tmp_path: Path) -> None:
    data = base(tmp_path)
    data["checkpoint"] = {"dir": str(tmp_path / "ck" / "a b"), "stripe_count": 4}
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path)
    assert run.returncode == 0 and (tmp_path / "ck" / "a b").is_dir()
    assert "lfs" not in run.stderr + run.stdout and "stripe" not in run.stderr + run.stdout
    assert run.read("lfs.calls") == ""


def test_checkpoint_dir_with_lfs_is_striped(tmp_path: Path) -> None:
    data = base(tmp_path)
    data["checkpoint"] = {"dir": str(tmp_path / "ck"), "stripe_count": 4}
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path, lfs=True)
    assert run.returncode == 0
    assert run.read("lfs.calls") == f"setstripe -c 4 -- {tmp_path / 'ck'}\n"


def test_setup_lines_run_in_order_and_a_broken_one_stops_the_job(tmp_path: Path) -> None:
    data = base(tmp_path)
    data["run"]["setup"] = ["export FROM_SETUP=1", "cd /", "echo \"$PWD\" > \"$STANDIN_LOG/pwd\""]
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path)
    assert run.returncode == 0 and run.read("pwd") == "/\n"
    assert "FROM_SETUP=1" in run.nul_list("command.env")
    data["run"]["setup"] = ['echo "unterminated', "false"]
    again = tmp_path / "again"
    again.mkdir()
    run = run_script(render_script(JobSpec.from_dict(data)), again)
    assert run.returncode == 1 and "setup line failed: echo \"unterminated" in run.stderr
    assert run.read("srun.argv") == ""   # never launched


def _wait_for(path: Path, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"


def signal_script(script: str, root: Path, sig: int, **env: str) -> tuple[int, str, Path]:
    """Start a rendered script (training step: the srun stand-in sleeping), send the batch
    shell ``sig`` once it waits for the step; (exit status, stderr, stand-in log dir)."""
    proc, log = start_script(script, root, STANDIN_SRUN_MODE="sleep", **env)
    try:
        _wait_for(log / "srun.argv")
        time.sleep(0.2)   # let bash reach `wait`
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=15)
    finally:
        kill_group(proc)
    return proc.returncode, err, log


def _ledger(root: Path, *lines: str) -> Path:
    """The requeue ledger a rendered script keeps for job 4242 (no checkpoint dir: cwd)."""
    path = root / ".hpctrain-requeues-4242"
    if lines:
        path.write_text("".join(f"{line}\n" for line in lines))
    return path


def _requeues(cause: str, n: int, by: str = "script") -> list[str]:
    return [f"requeue cause={cause} restart_count={i} by={by}" for i in range(1, n + 1)]


@pytest.mark.parametrize("launcher, restarts, requeued, step_signal", [
    ("srun", "0", True, signal.SIGUSR2),        # the step gets the signal Slurm sent
    ("srun", "10", False, signal.SIGUSR2),      # budget used up: say so, do not requeue
    ("torchrun", "3", True, signal.SIGTERM),    # torchrun's agent only forwards TERM
])
def test_requeue_signal_is_forwarded_waited_for_and_requeues(tmp_path: Path, launcher: str,
                                                              restarts: str, requeued: bool,
                                                              step_signal: int) -> None:
    data = base(tmp_path, launcher)
    data["run"]["command"] = ["python3", "train.py"]
    data["requeue"] = {"max_requeues": 10, "signal": "USR2", "signal_lead_s": 30,
                       "max_time_limits": 20}
    ledger = _ledger(tmp_path, *_requeues("time_limit", int(restarts)))
    status, err, log = signal_script(render_script(JobSpec.from_dict(data)), tmp_path,
                                     signal.SIGUSR2, SLURM_RESTART_COUNT=restarts)
    assert status == 128 + step_signal, err
    calls = (log / "scontrol.calls").read_text()
    assert ("requeue 4242" in calls) == requeued, err
    last = ledger.read_text().splitlines()[-1]
    if requeued:
        n = int(restarts) + 1
        assert (f"(time_limit; restart {n} of max_requeues=10, time_limit requeue {n} of "
                "max_time_limits=20)") in err
        assert last == f"requeue cause=time_limit restart_count={n} by=script"
    else:
        assert "max_requeues=10 reached (this is restart 11)" in err
        assert last == "stop cause=time_limit restart_count=10 limit=max_requeues=10"


@pytest.mark.parametrize("cause, signum, key", [
    ("time_limit", signal.SIGUSR2, "max_time_limits"),
    ("preemption", signal.SIGTERM, "max_preemptions"),
])
def test_each_cause_has_its_own_limit(tmp_path: Path, cause: str, signum: int,
                                      key: str) -> None:
    """Two requeues of this cause already (and one of another): with its limit at 2 the
    third is refused, the ledger says which limit ended the job, and Slurm is told not to
    requeue it either (PreemptMode=REQUEUE would)."""
    other = "preemption" if cause == "time_limit" else "time_limit"
    data = base(tmp_path)
    data["requeue"] = {"max_requeues": 10, "signal_lead_s": 30, key: 2}
    ledger = _ledger(tmp_path, f"requeue cause={cause} restart_count=1 by=script",
                     f"requeue cause={other} restart_count=2 by=script",
                     f"requeue cause={cause} restart_count=3 by=slurm")
    _, err, log = signal_script(render_script(JobSpec.from_dict(data)), tmp_path, signum,
                                SLURM_RESTART_COUNT="3", STANDIN_PREEMPT_TIME=(
                                    "2026-11-21T05:15:55" if cause == "preemption" else "None"))
    assert (f"not requeueing job 4242 after a {cause}: {key}=2 reached "
            f"(this is {cause} requeue 3)") in err
    calls = (log / "scontrol.calls").read_text()
    assert "requeue 4242" not in calls and "update jobid=4242 requeue=0" in calls
    last = ledger.read_text().splitlines()[-1]
    assert last == f"stop cause={cause} restart_count=3 limit={key}=2"


def test_slurm_requeues_are_entered_in_the_ledger_and_reach_the_runtime(tmp_path: Path) -> None:
    """Restart 3, after a script requeue (restart 1) and two requeues Slurm did on its own.
    Each gap takes the previous run's own word (a requeue record, only possible for the
    newest), else how sacct saw the run end, else it counts as a node failure. The
    runtime hears the newest cause."""
    data = base(tmp_path)
    ledger = _ledger(tmp_path, "requeue cause=time_limit restart_count=1 by=script")
    states = "REQUEUED\nPREEMPTED\nNODE_FAIL\nRUNNING\n"
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path, SLURM_RESTART_COUNT="3",
                     STANDIN_SACCT_STATES=states)
    assert run.returncode == 0, run.stderr
    assert ledger.read_text().splitlines()[1:] == [
        "requeue cause=preemption restart_count=2 by=slurm",   # Slurm ended it PREEMPTED
        "requeue cause=node_fail restart_count=3 by=slurm"]
    assert "HPCTRAIN_LAST_EXIT_CAUSE=node_fail" in run.nul_list("command.env")
    assert run.read("sacct.calls") == "-n -X -D -P -j 4242 -o State\n"   # one call

    again = tmp_path / "again"
    again.mkdir()
    _ledger(again, "requeue cause=time_limit restart_count=1 by=script")
    (again / ".hpctrain-exit-4242").write_text(
        "cause=preemption\nexit_code=75\nrequeue=1\nstep=9\nrestart_count=1\njob_id=4242\n")
    run = run_script(render_script(JobSpec.from_dict(data)), again, SLURM_RESTART_COUNT="2",
                     STANDIN_SACCT_STATES="REQUEUED\nCANCELLED\nRUNNING\n")
    assert _ledger(again).read_text().splitlines()[-1] == \
        "requeue cause=preemption restart_count=2 by=slurm"   # the record's word
    assert "HPCTRAIN_LAST_EXIT_CAUSE=preemption" in run.nul_list("command.env")
    run = run_script(render_script(JobSpec.from_dict(data)), again, SLURM_RESTART_COUNT="2")
    assert run.read("sacct.calls").count("\n") == 1   # nothing missing: no sacct call


@pytest.mark.parametrize("notice, cause", [
    ("cause=time_limit\nrestart_count=0\n", "time_limit"),   # the script's own stop notice
    ("", "requeued"),   # somebody's `scontrol requeue`: counts for max_requeues only
])
def test_a_requeue_by_somebody_else_takes_the_stop_notice_or_counts_as_requeued(
        tmp_path: Path, notice: str, cause: str) -> None:
    """submitit (or a user, or an admin) ran `scontrol requeue`, not this script: sacct
    says REQUEUED. The stop notice of that run says why, if the shell caught a signal."""
    if notice:
        (tmp_path / ".hpctrain-stop-4242").write_text(notice)
    data = base(tmp_path)
    data["requeue"] = {"signal_lead_s": 30, "max_node_failures": 0}   # not a node failure
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path, SLURM_RESTART_COUNT="1",
                     STANDIN_SACCT_STATES="REQUEUED\nRUNNING\n")
    assert run.returncode == 0, run.stderr
    assert _ledger(tmp_path).read_text() == f"requeue cause={cause} restart_count=1 by=slurm\n"
    assert f"HPCTRAIN_LAST_EXIT_CAUSE={cause}" in run.nul_list("command.env")


def test_a_node_failure_past_its_limit_does_not_run_again(tmp_path: Path) -> None:
    """Slurm requeued the job after a node failure (nothing in the ledger, no record): with
    max_node_failures=0 the new run stops before launching anything and says why."""
    data = base(tmp_path)
    data["requeue"] = {"signal_lead_s": 30, "max_node_failures": 0}
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path, SLURM_RESTART_COUNT="1")
    assert run.returncode == 1
    assert ("not running job 4242 again after a node_fail requeue: max_node_failures=0 "
            "reached (this is node_fail requeue 1)") in run.stderr
    assert run.read("srun.argv") == ""   # never launched
    assert _ledger(tmp_path).read_text().splitlines() == [
        "requeue cause=node_fail restart_count=1 by=slurm",
        "stop cause=node_fail restart_count=1 limit=max_node_failures=0"]


@pytest.mark.parametrize("sig, preempt_time, requeued, notice", [
    (signal.SIGTERM, "2026-11-21T05:15:55", True, "preemption"),
    (signal.SIGTERM, "None", False, None),            # scancel: no notice, no requeue
    (signal.SIGUSR2, "None", True, "time_limit"),     # the --signal=B:USR2 warning
    (signal.SIGUSR2, "2026-11-21T05:15:55", True, "preemption"),  # send_user_signal
])
def test_the_stop_notice_and_the_requeue_follow_slurms_preempt_time(
        tmp_path: Path, sig: int, preempt_time: str, requeued: bool, notice: str | None) -> None:
    """The batch shell asks Slurm whether the job is being preempted (PreemptTime), tells
    the training step why in the stop notice, then requeues or not."""
    _, err, log = signal_script(render_script(JobSpec.from_dict(base(tmp_path))), tmp_path, sig,
                                STANDIN_PREEMPT_TIME=preempt_time, SLURM_RESTART_COUNT="2")
    calls = (log / "scontrol.calls").read_text()
    name = signal.Signals(sig).name.removeprefix("SIG")
    assert f"caught SIG{name} ({notice or 'no preemption'})" in err and "show job 4242" in calls
    stop_file = tmp_path / ".hpctrain-stop-4242"
    if notice:
        assert stop_file.read_text() == f"cause={notice}\nrestart_count=2\n"
    else:
        assert not stop_file.exists()
    assert ("requeue 4242" in calls) == requeued
    if not requeued:
        assert "SIGTERM without preemption (scancel or shutdown)" in err


def test_a_step_killed_before_the_shell_hears_of_it_counts_as_caught(tmp_path: Path) -> None:
    """Preemption signals the step too; it may die before the batch shell's TERM arrives."""
    data = base(tmp_path)
    data["run"]["command"] = ["bash", "-c", "kill -TERM $$"]
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path,
                     STANDIN_PREEMPT_TIME="2026-11-21T05:15:55")
    assert run.returncode == 143
    assert "the training step was killed by SIGTERM" in run.stderr
    assert "requeue 4242" in run.read("scontrol.calls")
    data["run"]["command"] = ["bash", "-c", "kill -SEGV $$"]
    (tmp_path / "segv").mkdir()
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path / "segv",
                     STANDIN_PREEMPT_TIME="2026-11-21T05:15:55")
    assert run.returncode == 139 and "requeue" not in run.read("scontrol.calls")


@pytest.mark.parametrize("command, how", [
    ("exit 3", "status 3"), ("kill -SEGV $$", "SIGSEGV")])
def test_a_silent_failure_leaves_a_crash_record(tmp_path: Path, command: str, how: str) -> None:
    """sys.exit(3), a segfault, the OOM killer: the runtime wrote nothing, so the batch
    script leaves the user_crash record `hpctrain status` shows; a record of this run
    that is already there (the runtime's exception record) is kept."""
    data = base(tmp_path)
    data["run"]["command"] = ["bash", "-c", command]
    record = tmp_path / ".hpctrain-exit-4242"
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path, SLURM_RESTART_COUNT="1")
    assert run.returncode != 0 and "requeue" not in run.read("scontrol.calls")
    fields = dict(line.split("=", 1) for line in record.read_text().splitlines())
    assert fields["cause"] == "user_crash" and fields["requeue"] == "0"
    assert fields["restart_count"] == "1" and fields["job_id"] == "4242"
    assert f"ended with {how} and no exception on record" in fields["error"]
    own = "cause=user_crash\nrequeue=0\nstep=7\nrestart_count=1\nerror=ValueError: x\n"
    record.write_text(own)
    run_script(render_script(JobSpec.from_dict(data)), tmp_path, SLURM_RESTART_COUNT="1")
    assert record.read_text() == own


def test_a_clean_exit_is_not_requeued(tmp_path: Path) -> None:
    run = run_script(render_script(JobSpec.from_dict(base(tmp_path))), tmp_path)
    assert run.returncode == 0
    assert "requeue" not in run.read("scontrol.calls")


@pytest.mark.parametrize("where", ["run.env", "sbatch", "nodes", "gpus_per_node", "layout.tp",
                                   "layout.pp", "layout.dp", "checkpoint.keep_last",
                                   "checkpoint.stripe_count", "requeue.max_requeues",
                                   "requeue.signal_lead_s"])
def test_hostile_keys_and_numbers_are_refused(tmp_path: Path, where: str) -> None:
    for template in PAYLOADS:
        payload = template.format(m=tmp_path / "PWNED")
        data = base(tmp_path)
        if where in ("run.env", "sbatch"):
            node = data["run"] if where == "run.env" else data
            node.setdefault(where.split(".")[-1], {})[payload] = "1"
        else:
            setter(where)(data, payload)
        with pytest.raises(SpecError):
            JobSpec.from_dict(data)


@pytest.mark.parametrize("step, record, requeued", [
    ("exit 75", None, True),                                   # runtime: preemption
    ("exit 76", None, True),                                   # runtime: time limit
    ("exit 1", "cause=time_limit\nrequeue=1\nrestart_count=0\n", True),  # torchrun hides 76
    ("exit 1", "cause=time_limit\nrequeue=1\nrestart_count=5\n", False),  # a stale record
    ("exit 1", None, False),                                   # a user crash
])
def test_requeue_follows_the_training_process_exit_code_and_record(
        tmp_path: Path, step: str, record: str | None, requeued: bool) -> None:
    """The step may end before Slurm's signal reaches the batch shell: the runtime's own
    word (exit code 75/76, or its exit record for this restart) decides."""
    data = base(tmp_path)
    data["run"]["command"] = ["bash", "-c", step]
    data["checkpoint"] = {"dir": str(tmp_path / "ckpt")}
    if record is not None:
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / ".hpctrain-exit-4242").write_text(record)
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path,
                     STANDIN_PREEMPT_TIME="2026-11-21T05:15:55")
    assert ("requeue 4242" in run.read("scontrol.calls")) == requeued, run.stderr
    assert ("stopped for requeue" in run.stderr) == requeued
