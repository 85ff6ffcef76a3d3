"""A site's partitions that nobody described, and a devcluster that counts like a real
site, on the real devcluster (issue 40).

On the strict site (``devcluster up --site strict``: CPUs and memory counted per job,
DefMemPerCPU, each task bound to its CPUs and each job held to its memory by cgroups where
the host has cgroup v1, a partition ``gpu`` in slurm.conf that no facts file describes), a
2 x 2 job per launcher (srun, torchrun, deepspeed) of the plainest DP loop a user writes
(tests/programs/plain_dp_loop.py), each rank first probed (tests/programs/resource_probe.py):
Slurm's word gives the facts, every job asks for its GPUs' share of each node's CPUs and
memory, each rank gets them (its CPUs in its affinity mask, its memory as its cgroup's
limit, where cgroups bind), and every job completes; a job on half of each node gets half
its memory; a job that asks for too little memory is ended (by the kernel's OOM killer in
its cgroup, else by Slurm's poller) and reported as out of memory, not as a crash.

On the worker's own devcluster, the operator creates a partition in Slurm only
(``scontrol create``): a 2 x 2 job completes on it; and, without queueing anything, the
facts' source in the dry run and in `templates list`; a site file laid over Slurm's facts key
by key; `templates init --from-slurm`; a partition Slurm does not have, refused by name; and
the devcluster's own `debug` facts left out where the active Slurm is not the devcluster.
A DeepSpeed script that declares ``--local_rank`` gets it with ``[run] local_rank_arg``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers import admin
from helpers.cluster import job_log, status, submit
from helpers.jobs import isolate
from helpers.slurm import wait_done
from helpers.specs import spec_toml

from hpctrain.slurm import client

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
PARTITION = "gpu"
# the devcluster's nodes: 2 GPUs and 4000 MB each; their CPUs per GPU, for each launcher's
# task (torchrun's one task per node drives both GPUs)
GPUS_PER_TASK = {"srun": 1, "deepspeed": 1, "torchrun": 2}
MIB = 1 << 20


@pytest.fixture(scope="module")
def slurm_only(cluster) -> str:
    """Partition ``gpu`` on nodes n1-n2 of the worker's devcluster, created in Slurm only;
    deleted afterwards."""
    admin.run(["scontrol", "delete", f"PartitionName={PARTITION}"], check=False)
    admin.run(["scontrol", "create", f"PartitionName={PARTITION}", "Nodes=n[1-2]",
               "MaxTime=00:30:00", "State=UP"])
    yield PARTITION
    admin.run(["scontrol", "delete", f"PartitionName={PARTITION}"], check=False)


def hpctrain(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def job_spec(root: Path, launcher: str, partition: str = PARTITION, name: str = "",
             **fields: object) -> str:
    work = root / (name or launcher)
    (work / "ckpt").mkdir(parents=True, exist_ok=True)
    loop = [sys.executable, str(PROGRAMS / "plain_dp_loop.py"), "--steps", "6",
            "--save-every", "3", "--step-sleep", "0.05", "--ckpt-dir", str(work / "ckpt"),
            "--events", str(work / "events.jsonl")]
    return spec_toml(
        name=f"site-{name or launcher}", partition=partition, nodes=2, time="00:10:00",
        output=f"{root}/job-%j.out", workdir=str(root),
        run={"launcher": launcher, "env": {"OMP_NUM_THREADS": "1"},
             "command": [sys.executable, str(PROGRAMS / "resource_probe.py"),
                         str(work / "probe"), "--", *loop]}, **fields)


def probes(root: Path, name: str) -> list[dict[str, object]]:
    return [json.loads(p.read_text())
            for p in sorted((root / name / "probe").glob("resources-*.json"))]


def steps_done(root: Path, name: str) -> set[int]:
    lines = (root / name / "events.jsonl").read_text().splitlines()
    return {e["step"] for e in map(json.loads, lines) if e["event"] == "step"}


def site_facts() -> tuple[int, int, bool]:
    """(CPUs, MB of memory per node, do cgroups hold jobs to them) of the cluster SLURM_CONF
    points at, as its Slurm says: the strict site binds with cgroups only where the host has
    cgroup v1."""
    node = client.run(["scontrol", "show", "node", "n1", "--oneliner"]).stdout
    cpus, mem = (int(node.split(f"{key}=")[1].split()[0]) for key in ("CPUTot", "RealMemory"))
    plugins = client.run(["scontrol", "show", "config"]).stdout
    task = next(ln for ln in plugins.splitlines() if ln.startswith("TaskPlugin "))
    return cpus, mem, "task/cgroup" in task


def test_on_a_strict_site_every_launcher_gets_its_cpus_and_memory_and_oom_is_named(
        strict_cluster: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in strict_cluster.items():
        monkeypatch.setenv(key, value)
    root = isolate(monkeypatch, tmp_path, shared=True)
    cpus, node_mb, cgroups = site_facts()
    # the site counts memory: a job that asks for none gets DefMemPerCPU per CPU
    held = client.run(["sbatch", "--parsable", "--hold", "-p", PARTITION, "--wrap=true"])
    job = held.stdout.strip()
    shown = client.run(["scontrol", "show", "job", job]).stdout
    client.run(["scancel", job])
    assert "MinMemoryCPU=256M" in shown, shown
    jobs = {name: submit(root / name, job_spec(root, name)) for name in GPUS_PER_TASK}
    jobs["half"] = submit(root / "half", job_spec(root, "srun", name="half", gpus_per_node=1))
    jobs["oom"] = submit(root / "oom", job_spec(root, "srun", name="oom",
                                                resources={"mem_per_node_gb": 0.1}))
    for name, job in jobs.items():          # one or two at a time: each takes the nodes
        if name == "oom":
            continue
        assert wait_done(job, 300) == "COMPLETED", (name, job_log(root, job)[-4000:])
        ranks = probes(root, name)
        world = 2 if name == "half" else 4
        assert sorted(p["rank"] for p in ranks) == [str(r) for r in range(world)], ranks
        want = cpus * GPUS_PER_TASK.get(name, 1) // 2
        assert all(p["cpus_per_task"] == str(want) and p["world"] == str(world)
                   for p in ranks), (name, ranks)
        if cgroups:     # the kernel holds each rank to them: its CPUs and its job's memory
            assert all(p["affinity"] == want for p in ranks), (name, ranks)
            # --mem=0 (every GPU of the node): all of its memory, and no SLURM_MEM_PER_NODE
            assert all(p["cgroup_memory_limit"] == int(p["mem_per_node"] or node_mb) * MIB
                       for p in ranks), (name, ranks)
        assert steps_done(root, name) == set(range(6)), name
    # half of each node's GPUs: half of its memory (in MiB, of Slurm's 4000 MB)
    assert all(p["mem_per_node"] == "1999" for p in probes(root, "half")), probes(root, "half")
    # too little memory: the step is ended (the kernel's OOM killer in the job's cgroup, else
    # Slurm's poller), and said so; the job is not called a crash
    assert wait_done(jobs["oom"], 300) == "FAILED", job_log(root, jobs["oom"])[-4000:]
    row = status(jobs["oom"])
    assert row["cause"] == "out_of_memory", row
    said = "oom-kill event" if cgroups else "exceeded memory limit"
    assert said in row["verdict"]["why"], row


def test_a_partition_only_slurm_knows_takes_a_2x2_job(
        slurm_only: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    # the dry run says where the facts come from and what the job asks for
    (root / "dry.toml").write_text(job_spec(root, "srun"))
    dry = hpctrain("submit", str(root / "dry.toml"), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["partition_facts"] == f"Slurm (partition {PARTITION})", plan
    assert plan["requests"]["cpus_per_task"] == 2 and plan["requests"]["memory"] == "mem=0"
    job = submit(root / "torchrun", job_spec(root, "torchrun"))
    assert wait_done(job, 240) == "COMPLETED", job_log(root, job)[-4000:]
    assert all(p["cpus_per_task"] == "4" for p in probes(root, "torchrun"))   # the worker's 4
    assert steps_done(root, "torchrun") == set(range(6))


def test_the_site_sees_where_each_partitions_facts_come_from(
        slurm_only: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    listed = hpctrain("templates", "list")
    assert listed.returncode == 0, listed.stderr
    line = next(ln for ln in listed.stdout.splitlines() if ln.strip().startswith("gpu "))
    assert "2 x gpu per node, 4 CPUs" in line and "facts: Slurm (partition gpu)" in line, line
    # a starting file for the sysadmin, from Slurm's word: it reads back as the same facts
    site = root / "site"
    made = hpctrain("templates", "init", "--from-slurm", PARTITION, "--dir", str(site))
    assert made.returncode == 0, made.stderr
    facts = tomllib.loads((site / "partitions" / "gpu.toml").read_text())
    assert (facts["gpus_per_node"], facts["cpus_per_node"], facts["max_time"],
            facts["max_nodes"]) == (2, 4, "00:30:00", 2), facts
    again = hpctrain("templates", "init", "--from-slurm", PARTITION, "--dir", str(site))
    assert again.returncode != 0 and "--force" in again.stderr
    # a site file that says only what Slurm does not know, and one override: key by key
    (site / "partitions" / "gpu.toml").write_text(
        'name = "gpu"\ncpus_per_node = 2\ngpu_peak_tflops = 989\n'
        '[env]\nNCCL_SOCKET_IFNAME = "lo"\n')
    (root / "job.toml").write_text(job_spec(root, "srun"))
    dry = hpctrain("submit", str(root / "job.toml"), "--dry-run", "--json", "--templates",
                   str(site))
    assert dry.returncode == 0, dry.stderr
    out = json.loads(dry.stdout)
    assert out["partition_facts"] == f"{site / 'partitions' / 'gpu.toml'}, over Slurm's facts"
    assert out["requests"]["cpus_per_task"] == 1          # the file's 2 CPUs / 2 GPUs
    assert "export NCCL_SOCKET_IFNAME=lo" in out["script"]
    # a partition Slurm does not have, and no file names: refused by name, before the queue
    (root / "nope.toml").write_text(job_spec(root, "srun", partition="nope"))
    nope = hpctrain("submit", str(root / "nope.toml"))
    assert nope.returncode != 0
    assert "unknown partition 'nope': Slurm has no partition of that name" in nope.stderr


def test_the_devclusters_facts_never_shadow_a_site_partition_of_the_same_name(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same controller, its slurm.conf under another ClusterName: to hpctrain a real
    site whose partition is called `debug`, as many are. Its facts are Slurm's (no
    loopback network variables, no container table, no devcluster template)."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    site_conf = root / "slurm.conf"
    site_conf.write_text(conf.replace("ClusterName=hpcdev", "ClusterName=site"))
    (root / "job.toml").write_text(job_spec(root, "srun", partition="debug"))
    env = {**os.environ, "SLURM_CONF": str(site_conf)}
    at_site = hpctrain("submit", str(root / "job.toml"), "--dry-run", "--json", env=env)
    assert at_site.returncode == 0, at_site.stderr
    out = json.loads(at_site.stdout)
    assert out["partition_facts"] == "Slurm (partition debug)", out
    assert "GLOO_SOCKET_IFNAME" not in out["script"]
    assert "HPCTRAIN_PREEMPTIBLE" not in out["script"]     # the devcluster's debug template
    here = hpctrain("submit", str(root / "job.toml"), "--dry-run", "--json")
    assert json.loads(here.stdout)["partition_facts"].endswith(
        "templates/devcluster/partitions/debug.toml")


@pytest.mark.deepspeed
def test_deepspeeds_local_rank_reaches_a_script_that_declares_it(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[run] local_rank_arg: a DeepSpeed tutorial's script (it declares --local_rank and an
    argument of its own) gets --local_rank=N as DeepSpeed's launcher would give it, equal to
    LOCAL_RANK on each of 2 x 2 ranks, and trains to the end."""
    root = isolate(monkeypatch, tmp_path, shared=True)
    (root / "ckpt").mkdir()
    spec = spec_toml(
        name="ds-local-rank", partition="debug", nodes=2, time="00:10:00",
        output=f"{root}/job-%j.out", workdir=str(root),
        run={"launcher": "deepspeed", "local_rank_arg": True,
             "command": [sys.executable, "-u", str(PROGRAMS / "plain_deepspeed.py"),
                         "--steps", "2"],
             "env": {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
                     "CKPT_DIR": str(root / "ckpt"), "EVENTS": str(root / "events.jsonl")}})
    job = submit(root, spec)
    assert wait_done(job, 240) == "COMPLETED", job_log(root, job)[-4000:]
    got = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]
    args = sorted((e for e in got if e["event"] == "args"), key=lambda e: int(e["rank"]))
    assert [(e["rank"], e["local_rank"], e["env_local_rank"]) for e in args] == [
        ("0", 0, "0"), ("1", 1, "1"), ("2", 0, "0"), ("3", 1, "1")], args
    assert {e["node"] for e in args} == {"n1", "n2"}
    assert [e["step"] for e in got if e["event"] == "step"] == [0, 1]   # --steps 2 arrived
