"""Rendered scripts executed by real bash, with srun/scontrol/lfs replaced by stand-ins.

Shell safety: a hostile value in any user field is either refused (SpecError) or
reaches the program byte for byte without being executed (the payloads would create
a marker file). Also: the Lustre branch, setup lines, and the hand-over to the
supervisor (a stop signal during setup is kept for it, not fatal). What the supervisor
decides is tested as a pure table (test_supervisor_decision.py) and on the real cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from hpctrain import protocol
from hpctrain.checkpoint import settings
from hpctrain.errors import SpecError
from hpctrain.render.script import render_script as _render_script
from hpctrain.spec.model import JobSpec
from helpers.standins import run_script


def render_script(spec: JobSpec) -> str:
    """The script as `hpctrain render` makes it here: the supervisor runs with this Python."""
    return _render_script(spec, python=sys.executable)

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


# the fields whose every payload is carried into a script that then runs (about 10 s
# each): the full suite's, not the quick tier's
CARRIED = ("run.command", "run.env.SAFE_NAME", "checkpoint.dir")


@pytest.mark.parametrize("field", [pytest.param(f, marks=pytest.mark.slow) if f in CARRIED
                                   else f for f in FIELDS])
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
        at = srun_argv.index("--kill-on-bad-exit=1") + 1
        assert srun_argv[at:at + 2] == ["bash", "-c"] and srun_argv[at + 3] == "hpctrain-agent"
        assert srun_argv[at + 4:at + 7] == ["python3", "-m", "torch.distributed.run"]
        # each task's agent: the endpoint from its environment (the first node, the port
        # from the job id, or the one the supervisor moved it to); the first node hosts
        agent = ["bash", "-c", srun_argv[at + 2], "hpctrain-agent", "env"]
        for node, host in (("n1", "is_host=1"), ("n2", "is_host=0"), ("", None)):
            task = {"MASTER_ADDR": "n1", "MASTER_PORT": "25242", "PATH": "/usr/bin:/bin",
                    **({"SLURMD_NODENAME": node} if node else {})}
            seen = dict(line.split("=", 1) for line in subprocess.run(
                agent, env=task, capture_output=True, text=True, check=True).stdout.splitlines())
            assert seen["PET_RDZV_ENDPOINT"] == "n1:25242"
            assert seen.get("PET_RDZV_CONF") == host, node   # no node name: torch's own guess
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
    data.update(nodes=2, layout={"tp": 2}, checkpoint={
        "dir": str(tmp_path / "ck"), "interval_steps": 7, "keep_last": 2, "keep_every": 10,
        "stripe_count": 4})
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path)
    env = dict(e.split("=", 1) for e in run.nul_list("command.env"))
    assert {k: env[k] for k in ("HPCTRAIN_TP", "HPCTRAIN_PP", "HPCTRAIN_DP", "HPCTRAIN_WORLD_SIZE",
                                "HPCTRAIN_CKPT_INTERVAL_STEPS", "HPCTRAIN_CKPT_KEEP_LAST",
                                "HPCTRAIN_CKPT_KEEP_EVERY", "HPCTRAIN_CKPT_STRIPE_COUNT",
                                "MASTER_ADDR", "MASTER_PORT", "HPCTRAIN_PREEMPTIBLE")} == {
        "HPCTRAIN_TP": "2", "HPCTRAIN_PP": "1", "HPCTRAIN_DP": "2", "HPCTRAIN_WORLD_SIZE": "4",
        "HPCTRAIN_CKPT_INTERVAL_STEPS": "7", "HPCTRAIN_CKPT_KEEP_LAST": "2",
        "HPCTRAIN_CKPT_KEEP_EVERY": "10", "HPCTRAIN_CKPT_STRIPE_COUNT": "4",
        "MASTER_ADDR": "n1", "MASTER_PORT": str(25000 + 4242 % 4000), "HPCTRAIN_PREEMPTIBLE": "1"}
    # what CheckpointManager() in that rank would use (hpctrain.checkpoint.settings)
    assert settings.resolve(None, env=env) == settings.Settings(
        str(tmp_path / "ck"), keep_last=2, keep_every=10, stripe_count=4, interval_steps=7)
    assert "CUDA_VISIBLE_DEVICES" not in env   # nothing relies on it (fake GPUs)


def test_a_rendezvous_port_another_job_listens_on_is_passed_over(tmp_path: Path) -> None:
    """Two jobs whose ids are 4000 apart share the first node: the later one takes the
    next port of the range, and says so, instead of failing to bind (a "user crash")."""
    import socket

    taken = 25000 + 4242 % 4000
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", taken))
        listener.listen()
        run = run_script(render_script(JobSpec.from_dict(base(tmp_path))), tmp_path,
                         SLURMD_NODENAME="n1")
    env = dict(e.split("=", 1) for e in run.nul_list("command.env"))
    assert env["MASTER_PORT"] == str(taken + 1), run.stderr
    assert f"hpctrain: port {taken} is taken on n1: the rendezvous takes the next" in run.stderr


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


@pytest.mark.parametrize("sig, requeued", [("USR2", True), ("TERM", False)])
def test_a_stop_signal_during_setup_reaches_the_supervisor(tmp_path: Path, sig: str,
                                                           requeued: bool) -> None:
    """A signal while setup lines run is noted by the batch shell (not fatal: setup goes
    on) and handed to the supervisor, which decides before starting anything: the requeue
    signal (the time-limit warning) requeues; a TERM that Slurm does not explain (no
    preemption, limit or cancellation) is a stop request, never requeued."""
    data = base(tmp_path)
    data["run"]["setup"] = [f"kill -{sig} $$", 'echo went on > "$STANDIN_LOG/setup"']
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path)
    assert run.read("setup") == "went on\n"
    assert run.read("srun.argv") == ""            # the training step never started
    calls = run.read("scontrol.calls")
    assert "show job -o 4242" in calls and ("requeue 4242" in calls) == requeued, run.stderr
    ledger = protocol.state_dir(tmp_path, "4242") / protocol.LEDGER
    if requeued:
        assert "requeueing job 4242 after a time_limit" in run.stderr
        assert ledger.read_text() == "requeue cause=time_limit restart_count=1 by=supervisor\n"
    else:
        assert "job 4242 ends: cancelled" in run.stderr and not ledger.exists()
    verdict = protocol.read_record(protocol.state_dir(tmp_path, "4242") / protocol.OUTCOME)
    assert verdict["cause"] == ("time_limit" if requeued else "cancelled")


def test_a_warning_lost_in_the_hand_over_is_taken_from_slurms_end_time(tmp_path: Path) -> None:
    """The warning can come in the instant the script hands over (signals ignored): the
    supervisor sees by Slurm's end time that it is due and requeues before starting."""
    data = base(tmp_path)
    lead = data["requeue"]["signal_lead_s"]
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path,
                     STANDIN_END_IN_S=str(lead - 5))
    assert run.read("srun.argv") == ""            # the training step never started
    assert "the time-limit warning is due" in run.stderr
    assert "requeue 4242" in run.read("scontrol.calls"), run.stderr


def test_a_warning_slurm_sent_before_the_script_listened_is_made_up_at_the_lead(
        tmp_path: Path) -> None:
    """Slurm sends the warning once, up to a minute early: on a short job it can come
    before the script exists (seen on the devcluster: a 1-minute job with a 45 s lead ran
    into its limit with no USR2). At the lead by Slurm's end time, a running step is asked
    to stop as if the signal had come, and the job is requeued for its time limit."""
    data = base(tmp_path)
    lead = data["requeue"]["signal_lead_s"]
    run = run_script(render_script(JobSpec.from_dict(data)), tmp_path,
                     STANDIN_END_AT=str(int(time.time()) + lead + 4), STANDIN_SRUN_MODE="sleep")
    assert "Slurm's did not come: taking it as received" in run.stderr
    assert "caught SIGUSR2 (time_limit); asking the training step to stop" in run.stderr
    assert "--signal=USR2 4242" in run.read("scancel.calls"), run.stderr
    assert "requeue 4242" in run.read("scontrol.calls"), run.stderr
    assert "requeueing job 4242 after a time_limit" in run.stderr


def test_the_step_gets_the_supervisors_environment(tmp_path: Path) -> None:
    """What a plain script can rely on: its restart count under both names, and where the
    runtime's files are; the hand-over's own variable does not leak into the step."""
    run = run_script(render_script(JobSpec.from_dict(base(tmp_path))), tmp_path,
                     SLURM_RESTART_COUNT="0")
    assert run.returncode == 0, run.stderr
    env = dict(e.split("=", 1) for e in run.nul_list("command.env"))
    state = protocol.state_dir(tmp_path, "4242")
    assert env["HPCTRAIN_RESTART_COUNT"] == "0" and env["HPCTRAIN_STATE_DIR"] == str(state)
    assert env["HPCTRAIN_EXIT_FILE"] == str(state / "exit")
    assert env["HPCTRAIN_STOP_SIGNALS"] == "USR2,TERM" and len(env["HPCTRAIN_RUN_ID"]) == 32
    assert "HPCTRAIN_EARLY_SIGNALS" not in env
    assert protocol.read_record(state / "identity")["run_id"] == env["HPCTRAIN_RUN_ID"]


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
