"""Rendering: directives, launchers, partition templates, site layering, template safety,
the reference scripts in sbatch/, and the `hpctrain render` command."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.errors import LayoutError, PartitionError, SpecError, TemplateError
from hpctrain.render.script import render, render_script, shq
from hpctrain.spec.model import JobSpec
from helpers import specs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "sbatch").glob("*.toml"))
# every spec here: specs.BASE on 2 nodes, tp=2, 30 minutes, unless a test says otherwise
spec = partial(specs.spec, {**specs.BASE, "nodes": 2, "time": "00:30:00", "layout": {"tp": 2}})


def directives(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines()
            if line.startswith("#SBATCH ")]


def test_directives_for_a_full_spec() -> None:
    s = spec(account="proj", qos="high", constraint="a100&ib", exclude="n[3-4]",
             reservation="maint", mail="me@example.org", workdir="/shared/w",
             output="/shared/logs/%x-%j.out", resources={"exclusive": True},
             sbatch={"mem-per-cpu": "1G"}, requeue={"signal": "SIGUSR1", "signal_lead_s": 90})
    assert directives(render_script(s)) == [
        "--job-name=gpt-tiny", "--partition=debug", "--nodes=2", "--ntasks-per-node=1",
        "--gpus-per-node=2", "--cpus-per-task=4", "--exclusive", "--time=00:30:00",
        "--account=proj", "--qos=high",
        "--constraint=a100&ib", "--exclude=n[3-4]", "--reservation=maint",
        "--mail-user=me@example.org", "--mail-type=END,FAIL", "--chdir=/shared/w",
        "--output=/shared/logs/%x-%j.out", "--open-mode=append", "--requeue",
        "--signal=B:USR1@90", "--mem-per-cpu=1G"]


def test_directives_come_before_any_command() -> None:
    lines = render_script(spec()).splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    assert all(line.startswith("#") or not line.strip() for line in lines[:last])


@pytest.mark.parametrize("launcher, per_node, needle", [
    ("torchrun", 1, "--nnodes=2 --nproc_per_node=2"),
    ("srun", 2, "LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS"),
    ("deepspeed", 2, "CROSS_RANK=$SLURM_NODEID CROSS_SIZE=$SLURM_NNODES"),
])
def test_launchers(launcher: str, per_node: int, needle: str) -> None:
    script = render_script(spec(run={"launcher": launcher, "command": ["python", "train.py"]}))
    assert f"--ntasks-per-node={per_node}" in directives(script)
    assert needle in script
    code = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert not any("ssh" in line or "hostfile" in line or "pdsh" in line for line in code)


def test_a_collective_timeout_given_reaches_the_job() -> None:
    """Left out, the runtime keeps its own 600 s (a long start-up barrier survives)."""
    assert "HPCTRAIN_COLLECTIVE_TIMEOUT_S" not in render_script(spec())
    given = render_script(spec(watchdog={"hang_timeout_s": 60, "collective_timeout_s": 20}))
    assert "export HPCTRAIN_COLLECTIVE_TIMEOUT_S=20\n" in given


def test_torchrun_uses_the_given_interpreter_or_torchrun() -> None:
    py = render_script(spec(run={"command": ["/venv/bin/python3.11", "-m", "pkg.train"]}))
    assert "/venv/bin/python3.11 -m torch.distributed.run" in py and py.endswith("-m pkg.train\n")
    other = render_script(spec(run={"command": ["./train.sh", "--x"]}))
    assert "  torchrun \\" in other and other.endswith("--no-python ./train.sh --x\n")
    with pytest.raises(SpecError, match="starts python without a script"):
        render_script(spec(run={"command": ["python"]}))


def test_partition_defaults_and_gres_request(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "partitions").mkdir(parents=True)
    (site / "partitions" / "big.toml").write_text(
        'name = "big"\ngpus_per_node = 8\ncpus_per_node = 64\nmem_per_node_gb = 512\n'
        'default_account = "ml"\ndefault_qos = "normal"\ngpu_request = "gres"\n'
        'modules = ["cuda/12.4", "nccl"]\n[env]\nNCCL_IB_HCA = "mlx5"\n')
    s = spec(partition="big", layout={"tp": 8}, qos="high")
    script = render_script(s, [site])
    assert {"--gres=gpu:8", "--account=ml", "--qos=high"} <= set(directives(script))
    assert "module load cuda/12.4" in script and "export NCCL_IB_HCA=mlx5" in script
    # debug's own template is not used for another partition
    assert "HPCTRAIN_PREEMPTIBLE" not in script


def test_a_partition_health_check_is_exported_as_words_never_as_shell(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "partitions").mkdir(parents=True)
    base = 'name = "big"\ngpus_per_node = 8\ncpus_per_node = 64\nmem_per_node_gb = 512\n'
    (site / "partitions" / "big.toml").write_text(
        base + 'health_check = ["/opt/site/gpu check", "$(reboot)"]\n'
        "health_check_timeout_s = 30\n")
    script = render_script(spec(partition="big", layout={"tp": 8}), [site])
    line = next(x for x in script.splitlines() if x.startswith("export HPCTRAIN_HEALTH_CHECK="))
    assert line == """export HPCTRAIN_HEALTH_CHECK='["/opt/site/gpu check", "$(reboot)"]'"""
    assert "export HPCTRAIN_HEALTH_CHECK_TIMEOUT_S=30" in script
    assert "HPCTRAIN_HEALTH_CHECK" not in render_script(spec())   # none by default
    (site / "partitions" / "big.toml").write_text(base + 'health_check = "gpu-check -q"\n')
    with pytest.raises(PartitionError, match="must be a command as a list of words"):
        render_script(spec(partition="big", layout={"tp": 8}), [site])


def test_partition_template_extends_base() -> None:
    debug = render(spec())
    urgent = render(spec(partition="urgent"))
    assert debug.template == "partitions/debug.sbatch.j2"
    assert urgent.template == "base.sbatch.j2"
    assert "export HPCTRAIN_PREEMPTIBLE=1" in debug.script
    assert "HPCTRAIN_PREEMPTIBLE" not in urgent.script
    # super() kept the base block: the layout exports are still there
    assert "export HPCTRAIN_TP=2" in debug.script


def test_site_directory_shadows_builtin_templates(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "launchers").mkdir(parents=True)
    (site / "launchers" / "srun.j2").write_text(
        "# site srun\nsrun --mpi=pmix {{ spec.run.command | shq }} &\n")
    s = spec(run={"launcher": "srun", "command": ["python", "x y.py"]})
    result = render(s, [site])
    assert "# site srun\nsrun --mpi=pmix python 'x y.py' &" in result.script
    assert render_script(s).count("--mpi=pmix") == 0   # built-in unchanged


def test_templates_cannot_print_unquoted_values(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "launchers").mkdir(parents=True)
    (site / "launchers" / "srun.j2").write_text("srun {{ spec.run.command[0] }} &\n")
    with pytest.raises(TemplateError, match=r"prints 'python' without a quoting filter"):
        render_script(spec(run={"launcher": "srun", "command": ["python", "t.py"]}), [site])


@pytest.mark.parametrize("body, error", [
    ("{{ nope | shq }}", "'nope' is undefined"),                          # StrictUndefined
    ("{% if %}", "srun.j2"),                                             # syntax error, located
    ("#SBATCH --comment={{ spec.run.command[1] | directive }}", "cannot go on an #SBATCH line"),
])
def test_broken_site_templates_fail_clearly(tmp_path: Path, body: str, error: str) -> None:
    (tmp_path / "launchers").mkdir()
    (tmp_path / "launchers" / "srun.j2").write_text(body + "\n")
    with pytest.raises(TemplateError, match=error):
        render_script(spec(run={"launcher": "srun", "command": ["python", "a b"]}), [tmp_path])


def test_shq_filter() -> None:
    assert shq("a b") == "'a b'" and shq(["x", "it's"]) == "x 'it'\"'\"'s'" and shq(3) == "3"
    for bad in (None, True, {"a": 1}, "a\0b"):
        with pytest.raises(TemplateError):
            shq(bad)


def test_layout_and_partition_errors_surface_before_rendering() -> None:
    with pytest.raises(LayoutError, match="tp=3 does not divide gpus_per_node=2: choose tp in 1, 2"):
        render_script(spec(layout={"tp": 3}))
    with pytest.raises(PartitionError, match="unknown partition 'gpu': known partitions are debug, urgent"):
        render_script(spec(partition="gpu"))
    with pytest.raises(TemplateError, match="does not exist"):
        render_script(spec(), ["/nonexistent/templates"])


def test_rendering_ignores_the_environment(monkeypatch, tmp_path: Path) -> None:
    """render_script is pure: $HPCTRAIN_TEMPLATES is the command's business, not its."""
    (tmp_path / "base.sbatch.j2").write_text("#!/bin/bash\necho hijacked\n")
    monkeypatch.setenv("HPCTRAIN_TEMPLATES", str(tmp_path))
    assert "hijacked" not in render_script(spec(partition="urgent"))


# ---- the reference scripts --------------------------------------------------------------
@pytest.mark.parametrize("spec_path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_reference_scripts_match_fresh_renders(spec_path: Path) -> None:
    script = spec_path.with_suffix(".sbatch")
    assert script.is_file(), f"missing {script.name}: run python tools/regen_sbatch.py"
    assert script.read_text() == render_script(JobSpec.load(spec_path)), \
        f"{script.name} is stale: run python tools/regen_sbatch.py"


def test_reference_set_covers_the_layouts() -> None:
    assert {p.stem for p in EXAMPLES} >= {"dp", "tp", "pp", "3d", "deepspeed"}
    plans = {p.stem: render(JobSpec.load(p)).plan for p in EXAMPLES}
    assert plans["dp"].dp > 1 and plans["dp"].tp == plans["dp"].pp == 1
    assert plans["tp"].tp > 1 and plans["pp"].pp > 1
    assert plans["3d"].tp > 1 and plans["3d"].pp > 1
    assert plans["deepspeed"].launcher == "deepspeed"


@pytest.mark.parametrize("spec_path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_reference_scripts_pass_bash_n(spec_path: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(spec_path.with_suffix(".sbatch"))],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_regen_tool_check_mode() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "regen_sbatch.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rendering_imports_neither_torch_nor_submitit(tmp_path: Path) -> None:
    out = tmp_path / "job.sbatch"
    code = ("import sys, json\nfrom hpctrain.cli import main\n"
            f"rc = main(['render', {str(EXAMPLES[0])!r}, '-o', {str(out)!r}])\n"
            "print(json.dumps([rc, sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'submitit', 'deepspeed', 'numpy'))]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [0, []], proc.stderr
    assert out.read_text().startswith("#!/bin/bash")


def test_output_to_a_device_writes_in_place_and_never_renames_over_it(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    assert main(["render", str(EXAMPLES[0]), "-o", str(fifo)]) == 0
    assert reader.communicate(timeout=10)[0] == \
        render_script(JobSpec.load(EXAMPLES[0]), python=sys.executable)
    assert stat.S_ISFIFO(fifo.stat().st_mode)


# ---- the command ---------------------------------------------------------------------------
def write_cli_spec(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(specs.spec_toml(name="cli-job", partition="debug", nodes=2,
                                    run={"command": ["python", "train.py"]}))
    return path


def test_render_command_prints_and_overrides(tmp_path: Path, capsys) -> None:
    path = write_cli_spec(tmp_path)
    assert main(["render", str(path), "--set", "layout.tp=2", "--set", "time=00:20:00"]) == 0
    out = capsys.readouterr().out
    assert out == render_script(JobSpec.load(path).with_overrides(
        {"layout.tp": 2, "time": "00:20:00"}), python=sys.executable)
    assert "export HPCTRAIN_TP=2" in out and "#SBATCH --time=00:20:00" in out


def test_render_command_writes_a_file_atomically(tmp_path: Path, capsys) -> None:
    path, out = write_cli_spec(tmp_path), tmp_path / "job.sbatch"
    assert main(["render", str(path), "-o", str(out)]) == 0
    assert out.read_text() == render_script(JobSpec.load(path), python=sys.executable)
    assert "tp=1 pp=1 dp=4 world=4" in capsys.readouterr().err
    # the supervisor runs with the interpreter that rendered, unless --python names another
    assert f"exec {sys.executable} -m hpctrain.supervisor -- " in out.read_text()
    assert main(["render", str(path), "--python", "/opt/py/bin/python3", "-o", str(out)]) == 0
    assert "exec /opt/py/bin/python3 -m hpctrain.supervisor -- " in out.read_text()
    before = out.read_text()
    assert main(["render", str(path), "--set", "layout.tp=3", "-o", str(out)]) == 2
    assert out.read_text() == before          # a failed render loses nothing
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("args, message", [
    (["--set", "layout.tpp=2"], "unknown key 'layout.tpp' (did you mean 'layout.tp'?)"),
    (["--set", "layout.tp=3"], "tp=3 does not divide gpus_per_node=2: choose tp in 1, 2"),
    (["--set", "nodes"], "use key=value"),
    (["--set", "name=a b"], "name='a b' is not a valid name"),
    (["--templates", "/nonexistent"], "template directory '/nonexistent' does not exist"),
])
def test_render_command_errors(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    assert main(["render", str(write_cli_spec(tmp_path)), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hpctrain: error: ") and message in err


def test_render_command_honours_hpctrain_templates(tmp_path: Path, monkeypatch, capsys) -> None:
    site = tmp_path / "site"
    (site / "partitions").mkdir(parents=True)
    (site / "partitions" / "debug.sbatch.j2").write_text(
        '{% extends "base.sbatch.j2" %}{% block header %}# site header\n{% endblock %}')
    monkeypatch.setenv("HPCTRAIN_TEMPLATES", str(site))
    assert main(["render", str(write_cli_spec(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash\n# site header\n#SBATCH --job-name=cli-job")
