"""`hpctrain templates list | show | check`: the sysadmin's commands."""

from __future__ import annotations

from pathlib import Path

from hpctrain.cli import main
from hpctrain.spec.partitions import partitions_in
from hpctrain.render.script import resolve_dirs
from hpctrain.render.check import check_cases, sample_layouts
from helpers.specs import spec_toml

ROOT = Path(__file__).resolve().parents[2]


def test_list_shows_templates_partitions_and_sources(tmp_path: Path, capsys) -> None:
    (tmp_path / "launchers").mkdir()
    (tmp_path / "launchers" / "srun.j2").write_text("srun {{ spec.run.command | shq }} &\n")
    assert main(["templates", "list", "--templates", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "launchers/srun.j2" in out and f"{tmp_path}/launchers/srun.j2  (overrides 1 more)" in out
    assert "base.sbatch.j2" in out and "launchers/deepspeed.j2" in out
    assert "debug      2 x a100-80gb per node, 4 CPUs, 4 GB, max_nodes=2, " \
           "max_time=1-00:00:00, template partitions/debug.sbatch.j2; facts: " \
           f"{ROOT}/templates/devcluster/partitions/debug.toml" in out
    assert "urgent" in out and "template base.sbatch.j2" in out


def test_show_template_and_partition(capsys) -> None:
    assert main(["templates", "show", "launchers/torchrun.j2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# launchers/torchrun.j2 from ")
    assert (ROOT / "templates" / "launchers" / "torchrun.j2").read_text() in out
    assert main(["templates", "show", "srun"]) == 0          # short launcher name
    assert "--ntasks-per-node" in capsys.readouterr().out
    assert main(["templates", "show", "debug"]) == 0
    out = capsys.readouterr().out
    assert 'name = "debug"' in out and '{% extends "base.sbatch.j2" %}' in out
    assert main(["templates", "show", "urgent"]) == 0
    assert "renders with base.sbatch.j2" in capsys.readouterr().out


def test_show_unknown_name_lists_what_exists(capsys) -> None:
    assert main(["templates", "show", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no template or partition named 'nope'" in err and "partitions: debug, urgent" in err


def test_check_covers_every_partition_launcher_and_layout(capsys) -> None:
    assert main(["templates", "check"]) == 0
    out = capsys.readouterr().out
    parts = partitions_in(resolve_dirs())
    # every launcher x layout, and per partition with Slurm's OCI runtime one torchrun job
    # in a container (OCI containers start one task per node)
    expected = sum(3 * len(sample_layouts(p)) + (p.container is not None) for p in parts)
    assert len(check_cases(parts)) == expected and f"{expected} passed, 0 failed" in out
    labels = {c.label.split()[2] for c in check_cases(parts) if "container" not in c.label}
    assert labels == {"dp", "tp", "pp", "tp+pp+dp"}
    assert "ok    debug      torchrun  in a oci container" in out


def test_check_reports_broken_site_templates(tmp_path: Path, capsys) -> None:
    (tmp_path / "launchers").mkdir()
    # a bash syntax error that Jinja cannot see, and a template that forgets | shq
    (tmp_path / "launchers" / "srun.j2").write_text("srun {{ spec.run.command | shq }} & )\n")
    (tmp_path / "launchers" / "deepspeed.j2").write_text("srun {{ spec.name }} &\n")
    assert main(["templates", "check", "--templates", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "FAIL  debug      srun" in captured.out and "bash -n: " in captured.out
    assert "FAIL  urgent     deepspeed" in captured.out
    assert "render: " in captured.out and "without a quoting filter" in captured.out
    assert "ok    debug      torchrun" in captured.out
    # 3 partitions x (12 cases + 1 torchrun job in a container)
    assert "24 of 39 case(s) failed" in captured.err


def test_check_reports_broken_partition_facts(tmp_path: Path, capsys) -> None:
    (tmp_path / "partitions").mkdir()
    (tmp_path / "partitions" / "bad.toml").write_text('name = "bad"\ngpus_per_node = "two"\n')
    assert main(["templates", "check", "--templates", str(tmp_path)]) == 2
    assert "partitions: " in capsys.readouterr().out


def test_check_skips_partitions_without_gpus(tmp_path: Path, capsys) -> None:
    (tmp_path / "partitions").mkdir()
    (tmp_path / "partitions" / "cpu.toml").write_text(
        'name = "cpu"\ngpus_per_node = 0\ncpus_per_node = 64\nmem_per_node_gb = 256\n')
    assert main(["templates", "check", "--templates", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skip  cpu        (no GPUs" in out and "39 passed, 0 failed, 1 partition(s) skipped" in out


def test_show_base_by_short_name(capsys) -> None:
    assert main(["templates", "show", "base"]) == 0
    assert capsys.readouterr().out.startswith("# base.sbatch.j2 from ")


def test_submit_dry_run_honours_hpctrain_templates(tmp_path, monkeypatch, capsys) -> None:
    """A site directory in $HPCTRAIN_TEMPLATES reaches `submit` as it reaches `render`."""
    from hpctrain.cli import main

    site = tmp_path / "site" / "partitions"
    site.mkdir(parents=True)
    (site / "debug.sbatch.j2").write_text(
        '{% extends "base.sbatch.j2" %}\n{% block header %}{{ super() }}# SITE-OVERRIDE\n'
        '{% endblock %}\n')
    spec = tmp_path / "job.toml"
    spec.write_text(spec_toml(name="t", partition="debug", run={"command": ["true"]}))
    monkeypatch.setenv("HPCTRAIN_TEMPLATES", str(tmp_path / "site"))
    for argv in (["render", str(spec)], ["submit", str(spec), "--dry-run"]):
        assert main(argv) == 0
        assert "# SITE-OVERRIDE" in capsys.readouterr().out, argv
