"""A training job in a real container runtime: Slurm's own OCI containers, run by runc,
on the devcluster (the image `hpctrain devcluster up` builds: this host's system, Python
and shared storage bind-mounted over an empty root).

One 2 nodes x 2 GPUs job (examples/train_gpt.py, tp=2 x dp=2, torchrun) runs in the
container with a read-only mount of its own; an `urgent` job preempts it; Slurm requeues
it, it resumes in the container from the step it saved and finishes with a model equal
bit for bit to an uninterrupted local run. Every rank checks first, from inside, that it
is in the container (Slurm's SLURM_CONTAINER: the job's own bundle over the image) and
sees the mount.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from hpctrain.devcluster.cluster import DevCluster
from hpctrain.render.check import runtime_error
from hpctrain.spec.container import ContainerFacts
from hpctrain.spec.partitions import partitions_in
from hpctrain.spec.site import devcluster_templates_dir
from helpers.examples import example_spec, submit_example
from helpers.jobs import isolate
from helpers.slurm import sacct_states, sbatch, squeue_state, wait_done, wait_until
from helpers import warm
from helpers.torchrun import EXAMPLES, bitwise_equal, env_for, events, final_state, steps
from helpers.specs import spec_toml

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
PROBE = Path(__file__).resolve().parents[1] / "programs" / "container_probe.py"
TOTAL, EVERY = 16, 8


def test_the_devcluster_partitions_have_their_runtime(cluster) -> None:
    parts = {p.name: p for p in partitions_in([devcluster_templates_dir()])}
    for name in ("debug", "urgent", "wide"):
        assert runtime_error(parts[name]) is None, name
    # the same check tells a runtime that is not there: this Slurm has no pyxis plugin,
    # this machine no apptainer
    pyxis = replace(parts["debug"], container=ContainerFacts(runtime="pyxis"))
    assert "no --container-image: the pyxis SPANK plugin is not loaded" in runtime_error(pyxis)
    apptainer = replace(parts["debug"], container=ContainerFacts(runtime="apptainer"))
    assert "'apptainer' is not on PATH here" in runtime_error(apptainer)


def test_a_2x2_job_in_a_container_is_preempted_and_resumes_bitwise(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolate(monkeypatch, tmp_path, shared=True)
    (root / "data").mkdir()
    (root / "data" / "hello").write_text("from the host")
    # the partitions allow images under instance 0's directory (templates/partitions/); every
    # instance's image is the same bundle of this host, and ./dev.sh brings instance 0 up
    image = str(DevCluster(instance=0).paths.host_image)
    log = root / "loss.jsonl"
    text = example_spec(root, name="in-container", total=TOTAL, save_every=EVERY,
                        step_sleep=0.25, extra=("--final-state", str(root / "final")))
    spec = tomllib.loads(text)
    spec["run"]["command"] = [sys.executable, str(PROBE), str(root / "probes"), "--",
                              *spec["run"]["command"]]
    spec["container"] = {"image": image, "mounts": [f"{root}/data:/mnt/data:ro"]}
    job = submit_example(root, spec_toml(**spec))
    try:
        # stop waiting as soon as the job is gone: a step that cannot start in the image
        # ends the job within seconds, and its log says why
        wait_until(lambda: len(steps(log)) >= 5 or not squeue_state(job), 240,
                   "5 training steps in the container")
        assert len(steps(log)) >= 5, (root / f"job-{job}.out").read_text()[-3000:]
        urgent = sbatch("-p", "urgent", "--nodes=2", "--gres=gpu:2",
                        f"--output={root}/urgent-%j.out", "--wrap", "sleep 2")
        assert wait_done(urgent, 180) == "COMPLETED"
        state = wait_done(job, 300)
    finally:
        if squeue_state(job):
            subprocess.run(["scancel", job], check=False)
    out = (root / f"job-{job}.out").read_text(errors="replace")
    assert state == "COMPLETED", out[-4000:]
    assert sacct_states(job) == ["REQUEUED", "COMPLETED"], out[-4000:]
    assert "container: Slurm OCI bundle" in out

    # inside: every rank of both runs, in the image's root, with the job's mount read-only
    probes = [json.loads(p.read_text()) for p in sorted((root / "probes").glob("*.json"))]
    assert sorted((p["restart"], p["rank"]) for p in probes) == [
        (r, str(k)) for r in ("0", "1") for k in range(4)]
    for p in probes:
        # Slurm's bundle is the job's own (the supervisor's), rooted in the image's root
        assert p["slurm_container"] == f"{root}/.hpctrain/jobs/{job}/container", p
        assert p["root"] == f"{p['slurm_container']}/rootfs", p
        assert p["hello"] == "from the host" and p["data_writable"] is False, p
        assert p["cwd"] == str(root) and p["world"] == "4", p
        # Slurm 22.05 gives every node's task in a container step the first task's
        # variables (n1's name on n2 too): the runtime does not pass that on as the node
        assert p["node"] == "n1" and p["runtime_node"] is None, p

    # resumed where it saved, every step once, and the same model as without interruption
    stops, starts = events(log, "stop"), events(log, "start")
    assert [s["cause"] for s in stops] == ["preemption"]
    assert [s["step"] for s in starts] == [0, stops[0]["step"]]
    assert sorted(set(steps(log))) == list(range(TOTAL))
    ref = tmp_path / "ref"
    ref.mkdir()
    args = ["--steps", str(TOTAL), "--save-every", str(EVERY), "--seed", "11",
            "--ckpt-dir", str(ref / "ckpt"), "--log-file", str(ref / "loss.jsonl"),
            "--final-state", str(ref / "final")]
    assert warm.run(EXAMPLES / "train_gpt.py", 4, args, env_for(tp=2), tmp_path / "ref.out") == 0
    assert bitwise_equal(final_state(root / "final", 4), final_state(ref / "final", 4))
