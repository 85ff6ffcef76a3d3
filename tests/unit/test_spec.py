"""Job spec parsing: defaults, types, Slurm time formats, unknown keys, overrides, TOML."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctrain.errors import SpecError
from hpctrain.spec.model import JobSpec
from hpctrain.spec.overrides import parse_set_options
from hpctrain.spec.checks import slurm_time_seconds
from helpers.specs import BASE, spec

ROOT = Path(__file__).resolve().parents[2]


def error(data: dict) -> str:
    with pytest.raises(SpecError) as exc:
        JobSpec.from_dict(data)
    return str(exc.value)


def test_issue_example_parses_with_every_field(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('''
name = "gpt-tiny"
partition = "debug"
nodes = 2
gpus_per_node = 2
time = "00:30:00"
account = "proj"
[layout]
tp = 2
pp = 1
dp = 2
num_layers = 12
num_heads = 8
[run]
launcher = "torchrun"
command = ["python", "train.py", "--lr", "3e-4"]
setup = ["source /path/venv/bin/activate"]
env = { OMP_NUM_THREADS = "1" }
[checkpoint]
dir = "/shared/ckpt/gpt-tiny"
interval_steps = 100
keep_last = 3
stripe_count = 4
[requeue]
max_requeues = 10
signal = "USR2"
signal_lead_s = 120
''')
    s = JobSpec.load(path)
    assert (s.nodes, s.gpus_per_node, s.time, s.account) == (2, 2, "00:30:00", "proj")
    assert (s.layout.tp, s.layout.pp, s.layout.dp) == (2, 1, 2)
    assert s.run.command == ("python", "train.py", "--lr", "3e-4")
    assert s.run.env == {"OMP_NUM_THREADS": "1"}
    assert s.checkpoint.stripe_count == 4 and s.requeue.signal == "USR2"
    assert s.time_seconds == 1800


def test_defaults() -> None:
    s = spec()
    assert (s.nodes, s.gpus_per_node, s.time) == (1, None, "01:00:00")
    assert (s.layout.tp, s.layout.pp, s.layout.dp) == (1, 1, None)
    assert s.run.launcher == "torchrun" and s.run.setup == () and s.run.env == {}
    assert s.checkpoint.dir is None and s.checkpoint.keep_last == 3
    assert (s.requeue.max_requeues, s.requeue.signal, s.requeue.signal_lead_s) == (10, "USR2", 120)
    assert (s.requeue.max_preemptions, s.requeue.max_time_limits,
            s.requeue.max_node_failures) == (10, 10, 3)


@pytest.mark.parametrize("given, limits", [
    ({"max_requeues": 50}, (50, 50, 3)),          # per-cause defaults follow the total...
    ({"max_requeues": 1}, (1, 1, 1)),             # ...node failures: 3, at most the total
    ({"max_requeues": 5, "max_preemptions": 0, "max_time_limits": 7, "max_node_failures": 2},
     (0, 7, 2)),
])
def test_each_cause_has_its_own_requeue_limit(given, limits) -> None:
    rq = spec(requeue=given).requeue
    assert (rq.max_preemptions, rq.max_time_limits, rq.max_node_failures) == limits


@pytest.mark.parametrize("data, key, hint", [
    ({**BASE, "nodez": 2}, "'nodez'", "'nodes'"),
    ({**BASE, "layout": {"tpp": 2}}, "'layout.tpp'", "'layout.tp'"),
    ({**BASE, "run": {"command": ["x"], "launchr": "srun"}}, "'run.launchr'", "'run.launcher'"),
    ({**BASE, "checkpoint": {"keep": 2}}, "'checkpoint.keep'", "'checkpoint.keep_last'"),
    ({**BASE, "requeue": {"max_requeue": 2}}, "'requeue.max_requeue'", "'requeue.max_requeues'"),
])
def test_unknown_keys_name_the_key_and_the_closest_valid_one(data, key, hint) -> None:
    msg = error(data)
    assert f"unknown key {key}" in msg and f"did you mean {hint}" in msg


@pytest.mark.parametrize("change, needle", [
    ({"nodes": 0}, "nodes=0 is out of range"),
    ({"requeue": {"max_node_failures": -1}}, "requeue.max_node_failures=-1 is out of range"),
    ({"requeue": {"max_preemptions": "5"}}, "requeue.max_preemptions='5' must be a whole number"),
    ({"nodes": True}, "nodes=True must be a whole number"),
    ({"nodes": "2"}, "nodes='2' must be a whole number"),
    ({"layout": {"tp": 0}}, "layout.tp=0 is out of range"),
    ({"layout": {"dp": 1.5}}, "layout.dp=1.5 must be a whole number"),
    ({"name": "a\nb"}, "name='a\\nb' is not a valid name"),
    ({"name": "my job"}, "is not a valid name"),
    ({"partition": "debug;rm"}, "partition='debug;rm' is not a valid name"),
    ({"account": "a$(x)"}, "cannot go on an #SBATCH line"),
    ({"constraint": "a100 && x"}, "cannot go on an #SBATCH line"),
    ({"output": "/tmp/a b.out"}, "cannot go on an #SBATCH line"),
    ({"mail": "not-an-address"}, "is not an e-mail address"),
    ({"mail_type": "END,FIAL"}, "did you mean 'FAIL'"),
    ({"time": "30:00:00:00"}, "is not a Slurm time"),
    ({"time": "0"}, "is zero"),
    ({"run": {"command": []}}, "run.command is empty"),
    ({"run": {"command": "python train.py"}}, "must be a list of strings"),
    ({"run": {"command": ["python", 3]}}, "run.command[1]=3 must be a string"),
    ({"run": {"command": ["a\0b"]}}, "NUL byte"),
    ({"run": {"command": ["x"], "launcher": "mpirun"}}, "use one of torchrun, srun, deepspeed"),
    ({"run": {"command": ["x"], "setup": ["a\nb"]}}, "line break"),
    ({"run": {"command": ["x"], "env": {"1BAD": "x"}}}, "is not a shell variable name"),
    ({"run": {"command": ["x"], "env": {"A;B": "x"}}}, "is not a shell variable name"),
    ({"run": {"command": ["x"], "env": {"HPCTRAIN_TP": "8"}}}, "sets HPCTRAIN_TP itself"),
    ({"run": {"command": ["x"], "env": {"MASTER_PORT": "1"}}}, "sets MASTER_PORT itself"),
    ({"run": {"command": ["x"], "env_passthrough": "WANDB_API_KEY"}}, "must be a list"),
    ({"run": {"command": ["x"], "env_passthrough": ["A;B"]}}, "run.env_passthrough[0]: 'A;B'"),
    ({"run": {"command": ["x"], "env_passthrough": ["SLURM_X"]}}, "sets SLURM_X itself"),
    ({"run": {"command": ["x"], "env_passthrough": ["K", "K"]}}, "names a variable twice"),
    ({"run": {"command": ["x"], "env": {"K": "v"}, "env_passthrough": ["K"]}},
     "K is also set in run.env"),
    ({"run": {"command": ["x"], "access": "world"}}, "run.access='world' is not an access"),
    ({"run": {"command": ["x"], "launcher": "deepspeed", "local_rank_arg": 1}},
     "run.local_rank_arg=1 must be true or false"),
    ({"run": {"command": ["python", "t.py"], "local_rank_arg": True}},
     "run.local_rank_arg = true is for launcher = \"deepspeed\" (its own launcher passes "
     "--local_rank); under 'torchrun' the ranks read LOCAL_RANK from the environment"),
    ({"run": {"command": ["python", "-u"], "launcher": "deepspeed", "local_rank_arg": True}},
     "starts python without a script: add the training script (or -m module) that takes "
     "--local_rank"),
    ({"checkpoint": {"access": "public"}}, "checkpoint.access='public' is not an access"),
    ({"checkpoint": {"dir": "relative/ckpt"}}, "must be an absolute path"),
    ({"checkpoint": {"dir": "/a\nb"}}, "line break"),
    ({"checkpoint": {"stripe_count": 0}}, "stripe_count=0 means nothing"),
    ({"requeue": {"signal": "USR3"}}, "use one of USR1, USR2"),
    ({"requeue": {"signal_lead_s": 70000}}, "out of range: use 0..65535"),
    ({"sbatch": {"nodes": 4}}, "use the field 'nodes' instead"),
    ({"sbatch": {"mem-per-cpu": "8G\n#SBATCH --x"}}, "cannot go on an #SBATCH line"),
    ({"sbatch": {"memory": "8G"}}, "is not an sbatch option"),
    ({"watchdog": {"collective_timeout_s": 0}}, "collective_timeout_s=0 is out of range"),
    ({"watchdog": {"collective_timeout_s": 400}},
     "watchdog.collective_timeout_s=400 is more than 30 s longer than "
     "watchdog.hang_timeout_s=300 (its default): ranks would wait in a collective long "
     "after the hang was found; set collective_timeout_s <= 330, raise hang_timeout_s, or "
     "leave collective_timeout_s out"),
    ({"watchdog": {"hang_timeout_s": 60, "collective_timeout_s": 91}},
     "set collective_timeout_s <= 90"),
    ({"watchdog": {"hang_timeout_s": 1800}},
     "watchdog.hang_timeout_s=1800 is not shorter than watchdog.save_timeout_s=1800 (its "
     "default): a save must be allowed longer than a step; set save_timeout_s to more "
     "than 1800"),
    ({"watchdog": {"hang_timeout_s": 600, "save_timeout_s": 120}},
     "set save_timeout_s to more than 600"),
])
def test_bad_values_are_refused_with_the_value_and_the_fix(change, needle) -> None:
    assert needle in error({**BASE, **change})


def test_missing_required_fields() -> None:
    assert "'name' is missing" in error({"partition": "debug", "run": {"command": ["x"]}})
    assert "run.command is missing" in error({**BASE, "run": {}})


@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("90:30", 5430), ("00:30:00", 1800), ("48:00:00", 172800),
    ("1-00", 86400), ("1-02:03", 93780), ("2-00:00:01", 172801),
    ("UNLIMITED", None), ("infinite", None),
])
def test_slurm_time_formats(text: str, seconds: int | None) -> None:
    assert slurm_time_seconds(text) == seconds
    assert spec(time=text).time == text


@pytest.mark.parametrize("text", ["00:60:00", "1-24", "1-00:00:60", "1:2:3:4", "-1", "1h", ""])
def test_bad_slurm_times(text: str) -> None:
    with pytest.raises(SpecError, match="not a Slurm time"):
        slurm_time_seconds(text)


def test_parse_set_options_reads_toml_values() -> None:
    got = parse_set_options(["layout.tp=4", "nodes = 2", "time=00:30:00", "name=run-2",
                             'run.command=["python", "x.py"]', "sbatch.exclusive=true",
                             "run.env.LR=3e-4", "mail=a@b.c"])
    assert got == {"layout.tp": 4, "nodes": 2, "time": "00:30:00", "name": "run-2",
                   "run.command": ["python", "x.py"], "sbatch.exclusive": True,
                   "run.env.LR": "3e-4", "mail": "a@b.c"}   # env values: as typed
    with pytest.raises(SpecError, match="use key=value"):
        parse_set_options(["layout.tp"])


def test_with_overrides_rechecks_and_keeps_the_rest() -> None:
    s = spec(nodes=1, layout={"tp": 2}, run={"command": ["python", "t.py"], "env": {"A": "1"}})
    o = s.with_overrides({"layout.tp": 1, "nodes": 2, "run.env.B": "2", "sbatch.mem-per-cpu": "8G"})
    assert (o.layout.tp, o.nodes, o.run.env, o.sbatch) == (1, 2, {"A": "1", "B": "2"},
                                                         {"mem-per-cpu": "8G"})
    assert s.layout.tp == 2  # the original is untouched (frozen)
    with pytest.raises(SpecError, match="did you mean 'layout.tp'"):
        s.with_overrides({"layout.tpp": 4})
    with pytest.raises(SpecError, match="did you mean 'nodes'"):
        s.with_overrides({"node": 4})
    with pytest.raises(SpecError, match="'nodes' is a value, not a table"):
        s.with_overrides({"nodes.x": 4})
    with pytest.raises(SpecError, match="layout.tp=0 is out of range"):
        s.with_overrides({"layout.tp": 0})


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(SpecError, match="bad.toml: not valid TOML"):
        JobSpec.load(bad)
    bad.write_text('name = "x"\npartition = "debug"\nnodez = 1\n[run]\ncommand=["x"]\n')
    with pytest.raises(SpecError, match=r"bad.toml: unknown key 'nodez'"):
        JobSpec.load(bad)
    with pytest.raises(SpecError, match="cannot read spec"):
        JobSpec.load(tmp_path / "missing.toml")


def test_example_specs_round_trip_through_toml() -> None:
    for path in sorted((ROOT / "sbatch").glob("*.toml")):
        s = JobSpec.load(path)
        assert JobSpec.from_dict(tomllib.loads(s.to_toml())) == s
        assert JobSpec.from_dict(s.to_dict()) == s


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
               max_size=20)


@settings(max_examples=60, deadline=None)
@given(args=st.lists(text, min_size=1, max_size=4), env=st.dictionaries(
    st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(
        lambda k: not k.startswith(("HPCTRAIN_", "SLURM_")) and k not in ("RANK", "PATH")),
    text, max_size=3), tp=st.integers(1, 8), nodes=st.integers(1, 64))
def test_to_toml_round_trips_any_text(args, env, tp, nodes) -> None:
    args = ["prog", *args]
    s = spec(nodes=nodes, layout={"tp": tp}, run={"command": args, "env": env})
    again = JobSpec.from_dict(tomllib.loads(s.to_toml()))
    assert again == s


def test_replace_is_rechecked() -> None:
    s = spec(nodes=2)
    assert s.replace(nodes=1).nodes == 1 and s.nodes == 2
    with pytest.raises(SpecError, match="nodes=0 is out of range"):
        s.replace(nodes=0)


@pytest.mark.parametrize("command, end", [
    (["python", "train.py", "--lr", "1"], 2),
    (["/venv/bin/python3.11", "-u", "-X", "dev", "-W", "ignore", "train.py", "x"], 7),
    (["python3", "-m", "pkg.train", "--x"], 3),
    (["python", "-c", "code", "a"], 3),
    (["./train.sh", "--x"], 1),
    (["deepspeed-job"], 1),
])
def test_where_deepspeeds_local_rank_goes_in_a_command(command: list[str], end: int) -> None:
    """After the program (a Python command's script or module), as DeepSpeed's launcher
    puts it: ``python -u train.py --local_rank=N ARGS``."""
    from hpctrain.spec.launch import script_end
    assert script_end(command) == end
