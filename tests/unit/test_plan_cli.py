"""`hpctrain plan` from the command line: text, JSON, errors, --write-spec, no torch."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.spec.model import JobSpec

HPCTRAIN = str(Path(sys.executable).parent / "hpctrain")
EIGHT_X_80 = ["--gpus-per-node", "8", "--gpu-mem", "80GB"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_text_report_shows_every_term_the_reason_and_the_candidates(capsys) -> None:
    code, out, err = run(capsys, "--params", "70B", "--mode", "inference", *EIGHT_X_80)
    assert code == 0, err
    assert "SI GB (1 GB = 1e9 bytes)" in out
    assert "assumed from the shape of Llama-2-70B" in out
    assert "recommended: 1 node(s) x 2 GPU(s) = 2 GPU(s), tp=2 pp=1 dp=1" in out
    for term in ("weights", "kv_cache", "overhead", "total"):
        assert f"    {term} " in out
    assert "why: fewest GPUs that fit (2)" in out
    assert "candidates (" in out and "  *    1     2   2   1    1" in out


def test_json_is_one_object_with_the_known_inference_figures(capsys) -> None:
    d = run_json(capsys, "--params", "70B", "--mode", "inference", *EIGHT_X_80)
    best = d["recommended"]
    assert (best["gpus"], best["tp"], best["fits"]) == (2, 2, True)
    assert best["memory_gb"]["weights"] == 70.0
    assert d["model_and_optimizer_gb"] == 140.0
    one_gpu = [c for c in d["candidates"] if c["gpus"] == 1]
    assert one_gpu and not any(c["fits"] for c in one_gpu)


def test_training_json_shows_activations_with_and_without_recomputation(capsys) -> None:
    d = run_json(capsys, "--params", "7B", *EIGHT_X_80, "--nodes", "1", "--zero", "3")
    assert d["model_and_optimizer_gb"] == 112.0
    acts = d["activations_gb_by_recompute"]
    assert acts["none"] > acts["selective"] > acts["full"] > 0
    assert d["recommended"]["zero"] == 3 and d["recommended"]["fits"]
    assert set(d["recommended"]["memory_gb"]) >= {"weights", "gradients", "optimizer",
                                                  "activations", "overhead", "total"}


def test_qlora_70b_fits_one_gpu_of_the_debug_partition(capsys) -> None:
    d = run_json(capsys, "--params", "70B", "--mode", "qlora", "--partition", "debug",
                 "--seq-len", "2048")
    assert d["recommended"]["gpus"] == 1 and d["hardware"]["partition"] == "debug"
    assert d["recommended"]["memory_gb"]["frozen_weights"] == 35.0


def test_cost_with_tokens_and_price(capsys) -> None:
    d = run_json(capsys, "--params", "7B", *EIGHT_X_80, "--tokens", "1T",
                 "--price-per-gpu-hour", "2", "--mfu", "0.5")
    cost = d["cost"]
    expected = 6 * 7e9 * 1e12 / (0.5 * 312e12) / 3600
    assert cost["gpu_hours"] == pytest.approx(expected)
    assert cost["cost"] == pytest.approx(2 * expected) and cost["mfu"] == 0.5
    code, out, _ = run(capsys, "--params", "7B", *EIGHT_X_80, "--tokens", "1T")
    assert code == 0 and "GPU-hours" in out and "40% MFU of 312 TFLOPS" in out


@pytest.mark.parametrize("args, message", [
    (["--params", "-7B", *EIGHT_X_80], "--params='-7B' is not a count"),
    (["--params", "lots", *EIGHT_X_80], "--params='lots' is not a count"),
    (["--params", "7B", "--gpus-per-node", "8", "--gpu-mem", "-80GB"], "--gpu-mem='-80GB'"),
    (["--params", "7B", "--partition", "nope"], "unknown partition 'nope': "),
    (["--params", "7B", "--partition", "debug", "--gpus-per-node", "8"], "not both"),
    (["--params", "7B"], "--partition NAME"),
    (["--params", "7B", *EIGHT_X_80, "--write-spec", "x.toml"], "--write-spec needs --partition"),
    (["--params", "7B", "--partition", "debug", "--nodes", "3"], "max_nodes=2"),
    (["--params", "7B", *EIGHT_X_80, "--mode", "inference", "--zero", "3"], "apply to training"),
])
def test_bad_input_is_one_clear_error(capsys, args: list[str], message: str) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith("hpctrain: error: ") and message in err


def test_no_fit_says_the_smallest_change_that_would(capsys) -> None:
    code, _, err = run(capsys, "--params", "7B", "--gpus-per-node", "1", "--gpu-mem", "80GB",
                       "--nodes", "1", "--zero", "0")
    assert code == 2
    assert "no layout fits 80 GB GPUs" in err and "Smallest change that would fit: " in err


def test_write_spec_writes_a_job_spec_and_never_clobbers(tmp_path: Path, capsys) -> None:
    target = tmp_path / "job.toml"
    code, out, err = run(capsys, "--params", "70B", "--mode", "qlora", "--partition", "debug",
                         "--write-spec", str(target), "--name", "q70", "--command",
                         "python finetune.py --lr 2e-4", "--checkpoint-dir", "/shared/ck/q70",
                         "--layers", "80", "--heads", "64")
    assert code == 0, err
    assert f"wrote job spec {target}" in out
    job = JobSpec.load(target)
    assert (job.name, job.partition, job.nodes, job.gpus_per_node) == ("q70", "debug", 1, 1)
    assert job.run.command == ("python", "finetune.py", "--lr", "2e-4")
    assert job.checkpoint.dir == "/shared/ck/q70" and job.time == "1-00:00:00"
    assert (job.layout.num_layers, job.layout.num_heads) == (80, 64)
    before = target.read_text()
    code, _, err = run(capsys, "--params", "7B", "--partition", "debug", "--write-spec",
                       str(target))
    assert code == 2 and "exists: pass --force" in err and target.read_text() == before
    code, _, _ = run(capsys, "--params", "7B", "--mode", "qlora", "--partition", "debug",
                     "--write-spec", str(target), "--force")
    assert code == 0
    rewritten = tomllib.loads(target.read_text())
    assert rewritten["name"] == "qlora-7b"
    assert rewritten["layout"].keys() == {"tp", "pp", "dp"}  # assumed shape not written
    assert "assumed from the shape of Llama-2-7B" in target.read_text()


def test_write_spec_json_reports_the_file(tmp_path: Path, capsys) -> None:
    d = run_json(capsys, "--params", "1.3B", "--partition", "urgent", "--write-spec",
                 str(tmp_path / "s.toml"))
    assert d["spec_written"] == str(tmp_path / "s.toml")
    assert tomllib.loads((tmp_path / "s.toml").read_text())["partition"] == "urgent"


def test_console_script_plans_without_importing_torch_or_submitit() -> None:
    probe = ("import sys, json; from hpctrain.cli import main; "
             "rc = main(['plan', '--params', '70B', '--partition', 'debug', '--mode', 'qlora', "
             "'--json']); "
             "print(json.dumps([rc, 'torch' in sys.modules, 'submitit' in sys.modules]), "
             "file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == [0, False, False]
    real = subprocess.run([HPCTRAIN, "plan", "--params", "13B", *EIGHT_X_80, "--json"],
                          capture_output=True, text=True, timeout=60)
    assert real.returncode == 0, real.stderr
    assert json.loads(real.stdout)["recommended"]["fits"] is True


@pytest.mark.parametrize("args", [
    ["--params", "13B"],                       # 2 nodes, dp=4, ZeRO-3: deepspeed launcher
    ["--params", "70B", "--mode", "lora"],     # tp=2 inside one node
])
def test_plan_write_spec_then_render_end_to_end(tmp_path: Path, args: list[str]) -> None:
    """The issue's promise: `hpctrain render` accepts the written spec unchanged."""
    spec = tmp_path / "plan.toml"
    plan = subprocess.run([HPCTRAIN, "plan", *args,
                           "--partition", "debug", "--write-spec", str(spec), "--json"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    best = json.loads(plan.stdout)["recommended"]
    render = subprocess.run([HPCTRAIN, "render", str(spec)], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert render.returncode == 0, render.stderr
    script = render.stdout
    assert script.startswith("#!")
    for var, value in (("HPCTRAIN_TP", best["tp"]), ("HPCTRAIN_PP", best["pp"]),
                       ("HPCTRAIN_DP", best["dp"])):
        assert f"{var}={value}" in script or f"{var}='{value}'" in script, var
    assert "#SBATCH --partition=debug" in script
    assert f"#SBATCH --nodes={best['nodes']}" in script
    assert best["tp"] * best["pp"] * best["dp"] > 1  # a real layout, not the trivial one
    # what the plan said the job asks for is what the script asks for
    asked = json.loads(plan.stdout)["requests"]
    for directive in (asked["gpus"], f"cpus-per-task={asked['cpus_per_task']}",
                      asked["memory"]):
        assert f"#SBATCH --{directive}\n" in script, (directive, asked)
    assert f"srun --nodes={best['nodes']}" in script and \
        f"--cpus-per-task={asked['cpus_per_task']} --distribution=block" in script


def _site_partition(tmp_path: Path, body: str) -> str:
    (tmp_path / "partitions").mkdir()
    (tmp_path / "partitions" / "site.toml").write_text(
        'name = "site"\ngpus_per_node = 4\ncpus_per_node = 32\nmem_per_node_gb = 512\n'
        'gpu_mem_gb = 40\ngpu_peak_tflops = 150\nintra_node_link = "pcie"\n'
        'inter_node_link = "ethernet"\nmax_nodes = 8\n' + body)
    return str(tmp_path)


def test_site_partition_facts_and_scaling_overrides_are_used(tmp_path: Path, capsys) -> None:
    site = _site_partition(tmp_path, "[scaling]\ninter_node = 0.5\n")
    d = run_json(capsys, "--params", "13B", "--partition", "site", "--templates", site,
                 "--tokens", "100B")
    hw = d["hardware"]
    assert (hw["gpus_per_node"], hw["gpu_mem_gb"], hw["max_nodes"]) == (4, 40, 8)
    assert hw["scaling"]["inter_node"] == 0.5 and hw["scaling"]["intra_node"] == 0.80
    assert d["cost"]["peak_tflops"] == 150
    assert all(c["capacity_gb"] == 40 and c["nodes"] <= 8 for c in d["candidates"])


def test_the_plan_says_what_the_job_asks_slurm_for_on_the_partition(tmp_path: Path,
                                                                  capsys) -> None:
    site = _site_partition(tmp_path, "")
    # ZeRO: DeepSpeed, one task per GPU: each gets its GPU's share of the node's 32 CPUs
    code, out, err = run(capsys, "--params", "13B", "--partition", "site", "--templates",
                         site, "--zero", "3", "--nodes", "2")
    assert code == 0, err
    assert out.rstrip().endswith(
        "under deepspeed on partition site, the job requests: --gpus-per-node=4 "
        "--cpus-per-task=8 --mem=0 (every GPU of each node; a site node has 32 CPUs and "
        "512 GB)"), out
    # torchrun: one task per node, all its GPUs' CPUs; the share of memory of 1 of 4 GPUs
    d = run_json(capsys, "--params", "1B", "--partition", "site", "--templates", site,
                 "--zero", "0", "--nodes", "1")
    assert d["recommended"]["gpus"] == 1, d["recommended"]
    assert d["requests"] == {"launcher": "torchrun", "cpus_per_task": 8,
                             "gpus": "gpus-per-node=1", "memory": "mem=131072M",
                             "exclusive": False,
                             "why": "1 of 4 GPUs of each node; a site node has 32 CPUs "
                                    "and 512 GB"}, d["requests"]
    # without a partition there are no CPU or memory facts to plan from
    assert run_json(capsys, "--params", "7B", *EIGHT_X_80)["requests"] is None


def test_bad_scaling_override_in_a_partition_is_an_error(tmp_path: Path, capsys) -> None:
    site = _site_partition(tmp_path, "[scaling]\ninter_nodes = 0.5\n")
    code, _, err = run(capsys, "--params", "7B", "--partition", "site", "--templates", site)
    assert code == 2 and "unknown scaling key(s) inter_nodes" in err


@pytest.mark.parametrize("extra, message", [
    (["--name", "bad name"], "name='bad name' is not a valid name"),
    (["--time", "forever"], "time='forever' is not a Slurm time"),
    (["--time", "2-00:00:00"], "time=2-00:00:00 exceeds partition 'debug''s max_time"),
    (["--checkpoint-dir", "relative/ckpt"], "must be an absolute path"),
])
def test_bad_spec_values_are_refused_and_nothing_is_written(tmp_path: Path, capsys,
                                                            extra: list[str], message: str) -> None:
    target = tmp_path / "job.toml"
    code, out, err = run(capsys, "--params", "7B", "--partition", "debug", "--write-spec",
                         str(target), *extra)
    assert code == 2 and message in err and out == ""
    assert list(tmp_path.iterdir()) == []


def test_write_spec_into_a_missing_directory_is_refused(tmp_path: Path, capsys) -> None:
    code, _, err = run(capsys, "--params", "7B", "--partition", "debug", "--write-spec",
                       str(tmp_path / "nope" / "job.toml"))
    assert code == 2 and "does not exist: create it first" in err


@pytest.mark.parametrize("args, message", [
    (["--mfu", "0"], "--mfu=0.0 must be a fraction"),
    (["--gpu-tflops", "-5"], "--gpu-tflops=-5.0 must be > 0"),
    (["--tokens", "-1T"], "--tokens='-1T'"),
    (["--adapter-fraction", "2", "--mode", "lora"], "--adapter-fraction=2.0 must be in (0, 1)"),
])
def test_bad_cost_and_adapter_options_are_refused(capsys, args: list[str], message: str) -> None:
    code, _, err = run(capsys, "--params", "7B", *EIGHT_X_80, *args)
    assert code == 2 and message in err


def test_all_lists_every_candidate(capsys) -> None:
    short = run_json(capsys, "--params", "70B", "--mode", "inference", *EIGHT_X_80)
    full = run_json(capsys, "--params", "70B", "--mode", "inference", *EIGHT_X_80, "--all")
    assert short["spec_written"] is None
    assert len(short["candidates"]) < short["candidates_total"]
    assert len(full["candidates"]) == full["candidates_total"] == short["candidates_total"]
