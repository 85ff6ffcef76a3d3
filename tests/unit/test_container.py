"""Containers without a cluster: the spec's [container], the partition's facts, the words
each runtime gets, scripts run through recorded-behaviour stand-ins of pyxis's srun and
`apptainer exec`, hostile values, and the supervisor's per-job OCI bundle.

The real runtime (Slurm's OCI containers with runc) runs in
tests/cluster/test_container_cluster.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from hpctrain import protocol
from hpctrain.errors import PartitionError, SpecError, SupervisorError
from hpctrain.render.check import check_cases
from hpctrain.render.script import render, render_script
from hpctrain.spec.container import ContainerSpec, Mount, parse_mount
from hpctrain.spec.model import JobSpec
from hpctrain.spec.partitions import Partition, read_partition_file
from hpctrain.supervisor.container import (bundle_config, hpctrain_inside, rootless,
                                           step_argv)
from helpers.standins import run_script

FACTS = {"pyxis": 'runtime = "pyxis"\nmounts = ["/lustre"]\n',
         "apptainer": 'runtime = "apptainer"\nmounts = ["/lustre"]\n',
         "oci": 'runtime = "oci"\nimage_prefixes = ["/images/"]\n',
         "required": 'runtime = "pyxis"\nrequired = true\n'}


def site(tmp: Path) -> Path:
    """A site directory with one 2-GPU partition per runtime (c-pyxis, c-apptainer, ...)."""
    (tmp / "site" / "partitions").mkdir(parents=True, exist_ok=True)
    for name, facts in FACTS.items():
        (tmp / "site" / "partitions" / f"c-{name}.toml").write_text(
            f'name = "c-{name}"\ngpus_per_node = 2\ncpus_per_node = 4\nmem_per_node_gb = 8\n'
            f"[container]\n{facts}")
    return tmp / "site"


def spec(partition: str, container: dict[str, Any] | None = None, **fields: Any) -> JobSpec:
    data: dict[str, Any] = {"name": "c", "partition": partition, "nodes": 2,
                            "time": "00:10:00", "requeue": {"signal_lead_s": 30},
                            "run": {"launcher": "torchrun", "command": ["python", "train.py"]},
                            **fields}
    if container is not None:
        data["container"] = container
    return JobSpec.from_dict(data)


def launcher_line(script: str) -> str:
    """The hand-over to the supervisor, continuation lines joined."""
    tail = script[script.index("exec "):]
    return " ".join(part.strip() for part in tail.split("\\\n"))


# ---- the spec ---------------------------------------------------------------------------
def test_container_table_reads_and_round_trips() -> None:
    s = spec("debug", {"image": "/var/lib/hpctrain/devcluster/images/host",
                       "mounts": ["/data", "/lustre/ds:/ds:ro"], "workdir": "/code",
                       "env": ["NCCL_DEBUG"], "writable": True})
    assert s.container == ContainerSpec(
        image="/var/lib/hpctrain/devcluster/images/host",
        mounts=(Mount("/data", "/data"), Mount("/lustre/ds", "/ds", ro=True)),
        workdir="/code", env=("NCCL_DEBUG",), writable=True)
    assert JobSpec.from_dict(s.to_dict()) == s
    assert "[container]" in s.to_toml()
    assert spec("debug").container is None
    assert JobSpec.from_dict(s.to_dict()).with_overrides(
        {"container.writable": False}).container.writable is False


@pytest.mark.parametrize(("container", "message"), [
    ({}, "container.image is missing"),
    ({"image": "x", "mount": []}, "unknown key 'container.mount'.*did you mean 'container.mounts'"),
    ({"image": "$(touch /x)"}, "is not an image"),
    ({"image": "-rm"}, "is not an image"),
    ({"image": "x", "mounts": "/data"}, "must be a list"),
    ({"image": "x", "mounts": ["data"]}, "must be an absolute path"),
    ({"image": "x", "mounts": ["/a,/b"]}, "without commas"),
    ({"image": "x", "mounts": ["/a:/b:/c:/d"]}, "source\\[:target\\[:ro\\]\\]"),
    ({"image": "x", "mounts": ["/a:/b:rx"]}, "the flag 'rx' is not one of ro, rw"),
    ({"image": "x", "mounts": ["/a/../etc:/b"]}, "'..'"),
    ({"image": "x", "workdir": "code"}, "container.workdir='code' must be an absolute path"),
    ({"image": "x", "env": ["NCCL DEBUG"]}, "list of variable names"),
    ({"image": "x", "writable": "yes"}, "container.writable='yes' must be true or false"),
])
def test_bad_container_tables_name_the_value_and_the_fix(container: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        spec("debug", container)


def test_mount_forms() -> None:
    assert parse_mount("/d", "m") == Mount("/d", "/d")
    assert parse_mount("/d:/e:rw", "m") == Mount("/d", "/e")
    assert str(parse_mount("/d::ro", "m")) == "/d:/d:ro"


# ---- the partition's facts --------------------------------------------------------------
def test_partition_facts(tmp_path: Path) -> None:
    part = read_partition_file(site(tmp_path) / "partitions" / "c-oci.toml")
    assert part.container.runtime == "oci" and part.container.image_prefixes == ("/images/",)
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "b"\ngpus_per_node = 1\ncpus_per_node = 1\nmem_per_node_gb = 1\n'
                   '[container]\nruntime = "docker"\n')
    with pytest.raises(PartitionError, match="container.runtime='docker': use one of pyxis, "
                                             "apptainer, oci"):
        read_partition_file(bad)


def test_devcluster_partitions_declare_slurms_oci_runtime() -> None:
    from hpctrain.spec.partitions import partitions_in
    from hpctrain.spec.site import devcluster_templates_dir

    facts = {p.name: p.container for p in partitions_in([devcluster_templates_dir()])}
    assert {facts[n].runtime for n in ("debug", "urgent", "wide")} == {"oci"}


# ---- joining the two ----------------------------------------------------------------------
@pytest.mark.parametrize(("partition", "container", "message"), [
    ("c-required", None, "runs jobs only in containers: add a \\[container\\] table"),
    ("c-oci", {"image": "/elsewhere/img"}, "is not allowed on partition 'c-oci': use an "
                                           "image starting with '/images/'"),
])
def test_the_partition_decides(tmp_path: Path, partition: str, container: dict | None,
                               message: str) -> None:
    with pytest.raises(SpecError, match=message):
        render(spec(partition, container), [site(tmp_path)])


def test_a_partition_without_a_runtime_refuses_a_container(tmp_path: Path) -> None:
    site(tmp_path)
    (tmp_path / "site" / "partitions" / "plain.toml").write_text(
        'name = "plain"\ngpus_per_node = 2\ncpus_per_node = 4\nmem_per_node_gb = 8\n')
    with pytest.raises(SpecError, match="partition 'plain' has no container runtime"):
        render(spec("plain", {"image": "/img"}), [tmp_path / "site"])


@pytest.mark.parametrize("launcher", ["srun", "deepspeed"])
def test_oci_runs_torchrun_only(tmp_path: Path, launcher: str) -> None:
    for gpus in (2, 1):   # one task per node or not: every node's task is told it is task 0
        s = spec("c-oci", {"image": "/images/x"}, gpus_per_node=gpus,
                 run={"launcher": launcher, "command": ["x"]})
        with pytest.raises(SpecError, match='SLURM_PROCID=0 everywhere.*use launcher = '
                                            '"torchrun"'):
            render(s, [site(tmp_path)])


# ---- the words per runtime ----------------------------------------------------------------
def test_pyxis_flags(tmp_path: Path) -> None:
    s = spec("c-pyxis", {"image": "nvcr.io#nvidia/pytorch:24.05-py3", "mounts": ["/ds:/ds:ro"],
                         "env": ["NCCL_DEBUG", "WANDB_PROJECT"]},
             checkpoint={"dir": "/ck/c"})
    line = launcher_line(render_script(s, [site(tmp_path)]))
    assert ("srun '--container-image=nvcr.io#nvidia/pytorch:24.05-py3' "
            "--container-mounts=/lustre:/lustre,/ds:/ds:ro,/ck/c:/ck/c,"
            '"$SLURM_SUBMIT_DIR:$SLURM_SUBMIT_DIR""${HPCTRAIN_CACHE_MOUNTS-}" '
            '--container-workdir="$SLURM_SUBMIT_DIR" '
            '"--container-name=hpctrain-$SLURM_JOB_ID" '
            "--container-env=NCCL_DEBUG,WANDB_PROJECT --nodes=2 --ntasks=2 --ntasks-per-node=1") in line
    # the site's defaults (writable or not, home mounted or not) stand unless the spec asks
    assert "--container-readonly" not in line and "mount-home" not in line
    ro = spec("c-pyxis", {"image": "/i.sqsh", "writable": False})
    assert "--container-readonly" in launcher_line(render_script(ro, [site(tmp_path)]))


def test_apptainer_wrap(tmp_path: Path) -> None:
    s = spec("c-apptainer", {"image": "/img/pt.sif", "workdir": "/code", "writable": True,
                             "env": ["NCCL_DEBUG"]})
    script = render_script(s, [site(tmp_path)])
    assert ("apptainer exec --nv --bind /lustre:/lustre,\"$SLURM_SUBMIT_DIR:$SLURM_SUBMIT_DIR\""
            "\"${HPCTRAIN_CACHE_MOUNTS-}\" --pwd /code --writable-tmpfs /img/pt.sif "
            "python -m torch.distributed.run"
            ) in launcher_line(script)
    assert ('if [[ -v NCCL_DEBUG ]]; then export APPTAINERENV_NCCL_DEBUG="$NCCL_DEBUG"; fi'
            in script)


def test_oci_flag_and_the_supervisors_plan(tmp_path: Path) -> None:
    s = spec("c-oci", {"image": "/images/pt", "mounts": ["/ds:/ds:ro"]},
             checkpoint={"dir": "/ck/c"}, workdir="/code")
    script = render_script(s, [site(tmp_path)])
    assert "srun --container=/images/pt --nodes=2" in launcher_line(script)
    # Slurm 22.05 gives every node's task in an OCI container the first task's variables:
    # torch tells the rendezvous host by its hostname there, not by SLURMD_NODENAME
    assert "PET_RDZV_ENDPOINT" in script and "PET_RDZV_CONF" not in script
    pyxis = render_script(spec("c-pyxis", {"image": "/i.sqsh"}), [site(tmp_path)])
    assert "export PET_RDZV_CONF=\"is_host=" in pyxis
    line = next(ln for ln in script.splitlines() if ln.startswith(f"export {protocol.CONTAINER}="))
    plan = json.loads(line.split("=", 1)[1].strip("'"))
    assert plan == {"image": "/images/pt", "mounts": ["/ds:/ds:ro", "/ck/c:/ck/c", "/code:/code"],
                    "runtime": "oci", "workdir": "/code", "writable": False}  # the job's


def test_templates_check_covers_containers(tmp_path: Path) -> None:
    from hpctrain.spec.partitions import partitions_in

    parts = {p.name: p for p in partitions_in([site(tmp_path)])}
    labels = [c.label for c in check_cases([parts["c-oci"], parts["c-required"]])]
    assert [lb for lb in labels if "container" in lb] == [
        "c-oci      torchrun  in a oci container", "c-required torchrun  in a pyxis container",
        "c-required srun      in a pyxis container",
        "c-required deepspeed in a pyxis container"]
    assert not any(lb.startswith("c-required") and "container" not in lb for lb in labels)


# ---- executed through the stand-ins ---------------------------------------------------------
def stood_in(tmp_path: Path, partition: str, container: dict, launcher: str = "srun",
             **env: str) -> Any:
    s = spec(partition, container, nodes=1,
             run={"launcher": launcher,
                  "command": [str(tmp_path / "standin-bin" / "argv-recorder"), "a b"]})
    return run_script(render_script(s, [site(tmp_path)], python=sys.executable), tmp_path,
                      NCCL_DEBUG="INFO", **env)


@pytest.mark.parametrize("partition, container", [
    ("c-pyxis", None), ("c-pyxis", {"image": "/i.sqsh"}), ("c-apptainer", {"image": "/i.sif"})],
    ids=["bare", "pyxis", "apptainer"])
@pytest.mark.parametrize("python", [False, True], ids=["program", "python-script"])
def test_deepspeeds_local_rank_argument_lands_after_the_script_in_any_container(
        tmp_path: Path, partition: str, container: dict | None, python: bool) -> None:
    """[run] local_rank_arg: --local_rank=N after the script (or the program), before its
    own arguments, where DeepSpeed's launcher puts it, whatever words the container adds
    before the command (apptainer's), and each argument still one word."""
    program = [str(tmp_path / "standin-bin" / "argv-recorder")]
    if python:     # a Python script that records its argv as the recorder does, with an
        script = tmp_path / "record.py"     # option for the interpreter before it
        script.write_text("import os, sys\nwith open(os.environ['STANDIN_LOG'] + "
                          "'/command.argv', 'w') as f:\n"
                          "    f.write(''.join(a + '\\0' for a in sys.argv[1:]))\n")
        program = [sys.executable, "-u", str(script)]
    s = spec(partition, container, nodes=1,
             run={"launcher": "deepspeed", "local_rank_arg": True,
                  "command": [*program, "a b", "--steps", "4"]})
    run = run_script(render_script(s, [site(tmp_path)], python=sys.executable), tmp_path,
                     NCCL_DEBUG="INFO")
    assert run.returncode == 0, run.stderr
    assert run.nul_list("command.argv") == ["--local_rank=0", "a b", "--steps", "4"]


def test_pyxis_flags_pass_pyxis_argument_handling(tmp_path: Path) -> None:
    run = stood_in(tmp_path, "c-pyxis", {"image": "nvcr.io#nvidia/pytorch:24.05-py3",
                                         "mounts": ["/ds:/ds:ro"], "env": ["NCCL_DEBUG"]})
    assert run.returncode == 0, run.stderr
    assert run.read("pyxis.args").splitlines() == [
        "image nvcr.io#nvidia/pytorch:24.05-py3", "mount /lustre /lustre rw",
        "mount /ds /ds ro", f"mount {tmp_path} {tmp_path} rw", f"workdir {tmp_path}",
        "name hpctrain-4242", "env NCCL_DEBUG"]
    assert run.nul_list("command.argv") == ["a b"]


def test_apptainer_words_pass_apptainers_argument_handling(tmp_path: Path) -> None:
    run = stood_in(tmp_path, "c-apptainer", {"image": "/img/pt.sif", "mounts": ["/ds::ro"],
                                             "env": ["NCCL_DEBUG", "UNSET_HERE"]})
    assert run.returncode == 0, run.stderr
    assert run.read("apptainer.args").splitlines() == [
        "flag nv", "bind /lustre /lustre rw", "bind /ds /ds ro", f"bind {tmp_path} {tmp_path} rw",
        f"pwd {tmp_path}", "image /img/pt.sif"]
    assert run.read("apptainer.env").splitlines() == ["APPTAINERENV_NCCL_DEBUG=INFO"]
    assert run.nul_list("command.argv") == ["a b"]


DIGEST_A, DIGEST_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def image_run(run: Any) -> str:
    """The image `apptainer exec` ran."""
    args = run.read("apptainer.args").splitlines()
    return next(a for a in args if a.startswith("image ")).removeprefix("image ")


def pulls(run: Any) -> list[str]:
    return [a.removeprefix("pull ") for a in run.read("apptainer.args").splitlines()
            if a.startswith("pull ")]


def test_a_registry_image_is_pulled_once_for_the_job_not_once_per_rank(tmp_path: Path) -> None:
    image = "docker://nvcr.io/nvidia/pytorch:24.05-py3"
    run = stood_in(tmp_path, "c-apptainer", {"image": image},
                   STANDIN_REGISTRY_DIGEST=DIGEST_A)
    assert run.returncode == 0, run.stderr
    sif = image_run(run)
    # pulled once, by the digest the tag named (the tag may move during the pull)
    assert pulls(run) == [f"docker://nvcr.io/nvidia/pytorch@{DIGEST_A}"]
    assert sif == str(tmp_path / ".hpctrain-sif" / f"sha256-{'a' * 64}.sif")
    assert Path(sif).read_text() == f"SIF of docker://nvcr.io/nvidia/pytorch@{DIGEST_A}\n"
    assert run.read("skopeo.calls").splitlines() == [
        f"inspect --no-tags --format {{{{.Digest}}}} {image}"]
    assert run.nul_list("command.argv") == ["a b"]
    # the next job (a requeue, a sweep point) finds the SIF of the same digest: no pull
    (run.log / "apptainer.args").unlink()
    again = stood_in(tmp_path, "c-apptainer", {"image": image},
                     STANDIN_REGISTRY_DIGEST=DIGEST_A)
    assert again.returncode == 0, again.stderr
    assert pulls(again) == [] and image_run(again) == sif
    # a SIF path is run as it is, and nobody asks a registry
    (run.log / "skopeo.calls").unlink()
    (run.log / "apptainer.args").unlink()
    local = stood_in(tmp_path, "c-apptainer", {"image": "/img/pt.sif"})
    assert image_run(local) == "/img/pt.sif" and not local.read("skopeo.calls")


def test_a_moved_tag_is_pulled_again_and_an_offline_node_says_what_it_runs(
        tmp_path: Path) -> None:
    image = "docker://ghcr.io/lab/train:latest"
    first = stood_in(tmp_path, "c-apptainer", {"image": image}, STANDIN_REGISTRY_DIGEST=DIGEST_A)
    assert first.returncode == 0, first.stderr
    old = image_run(first)
    (first.log / "apptainer.args").unlink()
    # the lab pushed a new :latest: the next job pulls it and runs it
    moved = stood_in(tmp_path, "c-apptainer", {"image": image}, STANDIN_REGISTRY_DIGEST=DIGEST_B)
    assert moved.returncode == 0, moved.stderr
    assert pulls(moved) == [f"docker://ghcr.io/lab/train@{DIGEST_B}"]
    new = image_run(moved)
    assert new.endswith(f"sha256-{'b' * 64}.sif") and Path(new).read_text().endswith(
        f"@{DIGEST_B}\n")
    assert Path(old).exists()     # a job started before may still run it
    (moved.log / "apptainer.args").unlink()
    # a compute node that cannot reach the registry runs the newest SIF and says so
    offline = stood_in(tmp_path, "c-apptainer", {"image": image})
    assert offline.returncode == 0, offline.stderr
    assert pulls(offline) == [] and Path(image_run(offline)).resolve() == Path(new)
    said = [ln for ln in offline.stderr.splitlines() if "cannot ask the registry" in ln]
    assert len(said) == 1, offline.stderr
    assert f"which image {image} is now (" in said[0] and "no such host" in said[0]
    assert f"running the SIF last run for it, sha256-{'b' * 64}.sif" in said[0]
    assert "a moved tag is not noticed until the registry answers" in said[0]


def test_an_offline_node_with_no_sif_pulls_the_tag_and_a_pinned_digest_asks_nobody(
        tmp_path: Path) -> None:
    image = "docker://ghcr.io/lab/train:1.0"
    offline = stood_in(tmp_path, "c-apptainer", {"image": image})
    assert offline.returncode == 0, offline.stderr
    assert pulls(offline) == [image] and "pulling the tag as it is" in offline.stderr
    (offline.log / "apptainer.args").unlink()
    (offline.log / "skopeo.calls").unlink()
    pinned = stood_in(tmp_path, "c-apptainer", {"image": f"docker://ghcr.io/lab/train@{DIGEST_A}"})
    assert pinned.returncode == 0, pinned.stderr
    assert pulls(pinned) == [f"docker://ghcr.io/lab/train@{DIGEST_A}"]
    assert image_run(pinned).endswith(f"sha256-{'a' * 64}.sif")
    assert not pinned.read("skopeo.calls")


def test_an_image_no_registry_can_be_asked_about_is_reused_and_the_log_says_so(
        tmp_path: Path) -> None:
    image = "oras://ghcr.io/lab/train:latest"
    first = stood_in(tmp_path, "c-apptainer", {"image": image})
    assert first.returncode == 0 and pulls(first) == [image], first.stderr
    (first.log / "apptainer.args").unlink()
    again = stood_in(tmp_path, "c-apptainer", {"image": image})
    assert again.returncode == 0 and pulls(again) == [], again.stderr
    assert f"running the SIF pulled before for {image} (only docker:// tags" in again.stderr
    assert not again.read("skopeo.calls")


def test_a_requeued_job_whose_earlier_run_was_killed_mid_pull_pulls_again(
        tmp_path: Path) -> None:
    """An adversarial run: a requeue keeps the job id, so the temporary SIF of a run killed
    in the pull was there again, `apptainer pull` refused it, and the job ended at start."""
    image = "docker://ghcr.io/lab/train:1.0"
    sif = tmp_path / ".hpctrain-sif" / f"sha256-{'a' * 64}.sif"
    sif.parent.mkdir()
    left = Path(f"{sif}.4242.tmp.sif")
    left.write_text("half a SIF\n")                # the killed pull's
    run = stood_in(tmp_path, "c-apptainer", {"image": image}, STANDIN_REGISTRY_DIGEST=DIGEST_A)
    assert run.returncode == 0, run.stderr
    assert pulls(run) == [f"docker://ghcr.io/lab/train@{DIGEST_A}"]
    assert image_run(run) == str(sif) and sif.read_text().startswith("SIF of ")
    assert not left.exists()


def test_a_shared_sif_dir_gets_sifs_every_user_can_read(tmp_path: Path) -> None:
    """The job's umask is 077 (private records): a SIF pulled with it into the site's
    shared sif_dir was 0600 (its new directory 0700), and no other user could run it."""
    sifs = tmp_path / "lustre" / "apptainer-sifs"
    FACTS["shared"] = f'runtime = "apptainer"\nsif_dir = "{sifs}"\n'
    try:
        run = stood_in(tmp_path, "c-shared", {"image": "docker://ghcr.io/lab/train:1.0"},
                       STANDIN_REGISTRY_DIGEST=DIGEST_A)
    finally:
        del FACTS["shared"]
    assert run.returncode == 0, run.stderr
    sif = sifs / f"sha256-{'a' * 64}.sif"
    assert image_run(run) == str(sif)
    assert sif.stat().st_mode & 0o777 == 0o644
    assert sifs.stat().st_mode & 0o777 == 0o755
    # ... and only there: the user's own SIFs (no sif_dir) keep the job's umask
    (run.log / "apptainer.args").unlink()
    own = stood_in(tmp_path, "c-apptainer", {"image": "docker://ghcr.io/lab/train:1.0"},
                   STANDIN_REGISTRY_DIGEST=DIGEST_A)
    assert own.returncode == 0, own.stderr
    assert Path(image_run(own)).stat().st_mode & 0o077 == 0


def setup_lines_run(root: Path, plan: Any, other_user: bool = False, unset: tuple[str, ...] = (),
                    path_first: Path | None = None, **env: str) -> Any:
    """Only the container's setup lines (the SIF, the caches) under the script's `set -u`
    and umask 077, through the stand-ins; they print HPCTRAIN_SIF and the cache mounts.
    ``other_user``: run as another user (nobody, where the tests run as root)."""
    import subprocess

    from hpctrain.render.container import container_setup
    from helpers.standins import script_env

    script = root / "setup.sh"
    script.write_text("set -uo pipefail\numask 077\n" + "\n".join(container_setup(plan))
                      + '\nprintf "%s\\n" "${HPCTRAIN_SIF:-}" "$HPCTRAIN_CACHE_MOUNTS"\n')
    full = script_env(root, **env)
    if path_first is not None:
        full["PATH"] = f"{path_first}:{full['PATH']}"
    for name in unset:
        full.pop(name, None)
    argv = ["/bin/bash", str(script)]
    if other_user and os.geteuid() == 0:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    proc = subprocess.run(argv, cwd=root, env=full, capture_output=True, text=True, timeout=30)
    return proc


@pytest.fixture
def two_users(tmp_path: Path) -> Any:
    """A directory both users can reach: user A's shared sif_dir, user B's submit dir.
    Where the tests run as root, B is nobody; else B is this user, and A's SIF is made
    unreadable (and A's directory unwritable) by its mode."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="hpctrain-users-"))
    root.chmod(0o755)
    own = root / "b-submit"
    own.mkdir()
    (root / "standin-log").mkdir()
    (root / "standin-log").chmod(0o777)
    if os.geteuid() == 0:
        os.chown(own, 65534, 65534)
    try:
        yield root, own
    finally:
        shutil.rmtree(root)


def test_a_shared_sif_another_user_cannot_read_is_pulled_into_ones_own_and_said(
        two_users: tuple[Path, Path]) -> None:
    from hpctrain.spec.container import ContainerPlan

    root, own = two_users
    sifs = root / "apptainer-sifs"
    sifs.mkdir(mode=0o755)
    theirs = sifs / f"sha256-{'a' * 64}.sif"
    theirs.write_text("A's SIF\n")
    # pulled by an hpctrain before the fix (0600); where the tests do not run as root, B is
    # this user, A's SIF: unreadable to B by its mode alone
    theirs.chmod(0o600 if os.geteuid() == 0 else 0o000)
    plan = ContainerPlan("apptainer", "docker://ghcr.io/lab/train:1.0", (), None, (), None,
                         sif_dir=str(sifs))
    run = setup_lines_run(root, plan, other_user=True, SLURM_SUBMIT_DIR=str(own),
                          HOME=str(own), STANDIN_REGISTRY_DIGEST=DIGEST_A)
    assert run.returncode == 0, run.stderr
    mine = own / ".hpctrain-sif" / theirs.name
    assert run.stdout.splitlines()[0] == str(mine) and mine.read_text().startswith("SIF of ")
    said = [ln for ln in run.stderr.splitlines() if "sif_dir cannot serve" in ln]
    assert len(said) == 1 and f"{theirs} is there but" in said[0], run.stderr
    assert "cannot read it (owner" in said[0] and f"own {mine} instead" in said[0]
    theirs.chmod(0o600)
    assert theirs.read_text() == "A's SIF\n"


def test_a_shared_sif_dir_another_user_cannot_write_is_said_and_ones_own_used(
        two_users: tuple[Path, Path]) -> None:
    from hpctrain.spec.container import ContainerPlan

    root, own = two_users
    sifs = root / "apptainer-sifs"
    sifs.mkdir(mode=0o755)
    if os.geteuid() != 0:
        sifs.chmod(0o555)
    plan = ContainerPlan("apptainer", "docker://ghcr.io/lab/train:1.0", (), None, (), None,
                         sif_dir=str(sifs))
    run = setup_lines_run(root, plan, other_user=True, SLURM_SUBMIT_DIR=str(own),
                          HOME=str(own), STANDIN_REGISTRY_DIGEST=DIGEST_B)
    sifs.chmod(0o755)
    assert run.returncode == 0, run.stderr
    mine = own / ".hpctrain-sif" / f"sha256-{'b' * 64}.sif"
    assert run.stdout.splitlines()[0] == str(mine) and mine.exists()
    assert f"cannot write {sifs}" in run.stderr and "a group directory" in run.stderr
    # the user's own SIFs keep the job's umask: private
    assert mine.stat().st_mode & 0o077 == 0


def test_an_unanswering_skopeo_is_killed_after_its_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`timeout 60 skopeo` sent TERM only: a skopeo that ignores it kept the job waiting."""
    from hpctrain.render import container as render_container
    from hpctrain.spec.container import ContainerPlan

    monkeypatch.setattr(render_container, "SKOPEO_TIMEOUT_S", 1)
    monkeypatch.setattr(render_container, "SKOPEO_KILL_S", 1)
    deaf = tmp_path / "deaf-bin"
    deaf.mkdir()
    (deaf / "skopeo").write_text("#!/bin/bash\ntrap '' TERM\nsleep 60\n")
    (deaf / "skopeo").chmod(0o755)
    plan = ContainerPlan("apptainer", "docker://ghcr.io/lab/train:1.0", (), None, (), None)
    run = setup_lines_run(tmp_path, plan, path_first=deaf)
    assert run.returncode == 0, run.stderr
    assert "cannot ask the registry" in run.stderr and "pulling the tag as it is" in run.stderr
    monkeypatch.undo()
    assert "timeout -k 5 60 skopeo inspect" in "\n".join(render_container.container_setup(plan))


def test_no_home_anywhere_leaves_the_model_caches_unmounted_and_the_log_says_so(
        tmp_path: Path) -> None:
    """An adversarial run: with no home in the container and HOME unset,
    ${XDG_CACHE_HOME:-$HOME/.cache} ended the script (set -u) before the hand-over."""
    from hpctrain.spec.container import ContainerPlan

    plan = ContainerPlan("pyxis", "/i.sqsh", (), None, (), False, home=False)
    cache = tmp_path / ".hpctrain-cache" / "4242"
    run = setup_lines_run(tmp_path, plan, unset=("HOME",))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[1] == f",{cache}:{cache}"     # the job's scratch only
    for name in ("HF_HOME", "TORCH_HOME"):
        assert (f"warning: {name} is not mounted into the container: it is unset and so are "
                "HOME and XDG_CACHE_HOME") in run.stderr
    # the user's own value is still mounted, and XDG_CACHE_HOME is still a default
    hf = tmp_path / "hf"
    mine = setup_lines_run(tmp_path, plan, unset=("HOME",), HF_HOME=str(hf),
                           XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert mine.returncode == 0, mine.stderr
    torch_home = tmp_path / "xdg" / "torch"
    assert mine.stdout.splitlines()[1] == (f",{cache}:{cache},{hf}:{hf},"
                                           f"{torch_home}:{torch_home}")
    assert "not mounted" not in mine.stderr


@pytest.mark.parametrize("name", ["HF_HOME", "TORCH_HOME", "HF_TOKEN_PATH"])
@pytest.mark.parametrize("blank", [" ", "\t", "\n"], ids=["space", "tab", "newline"])
def test_a_cache_path_with_whitespace_is_not_mounted_and_the_log_says_so(
        tmp_path: Path, name: str, blank: str) -> None:
    """A mount list is split on whitespace too (apptainer's --bind, pyxis's words): a path
    with a space, tab or newline is refused as one with , or : is."""
    from hpctrain.spec.container import ContainerPlan

    path = tmp_path / f"my{blank}cache"
    if name == "HF_TOKEN_PATH":
        path.write_text("hf_secret\n")
    plan = ContainerPlan("pyxis", "/i.sqsh", (), None, (), False)
    run = setup_lines_run(tmp_path, plan, **{name: str(path)})
    assert run.returncode == 0, run.stderr
    assert run.stdout == "\n\n"                        # no SIF, no mount
    assert f"warning: {path} is not mounted into the container" in run.stderr
    assert "without , : or whitespace" in run.stderr
    assert name == "HF_TOKEN_PATH" or not path.exists()


def test_image_names_for_the_digest() -> None:
    from hpctrain.spec.container import ContainerPlan

    def plan(image: str) -> ContainerPlan:
        return ContainerPlan("apptainer", image, (), None, (), None)

    assert plan("docker://nvcr.io/nvidia/pytorch:24.05-py3").repository == \
        "docker://nvcr.io/nvidia/pytorch"
    assert plan("docker://localhost:5000/train").repository == "docker://localhost:5000/train"
    assert plan("docker://localhost:5000/train:2").repository == "docker://localhost:5000/train"
    assert plan("docker://ubuntu:22.04").repository == "docker://ubuntu"
    assert plan(f"docker://x/y:1@{DIGEST_A}").repository == "docker://x/y"
    assert plan(f"docker://x/y@{DIGEST_A}").pinned_digest == DIGEST_A
    assert plan("docker://x/y:1").pinned_digest is None
    assert plan("docker://x/y:1").checks_digest and not plan("oras://x/y:1").checks_digest
    assert ContainerPlan.digest_sif(DIGEST_A) == f"sha256-{'a' * 64}.sif"
    # the last SIF of a reference keeps the name earlier versions gave the SIF itself
    assert plan("docker://x/y:1").sif_name == plan("docker://x/y:1").sif_name != \
        plan("docker://x/y:2").sif_name


@pytest.mark.parametrize("gpu, flag", [("nvccli", "--nvccli"), ("none", None)])
def test_the_site_says_how_apptainer_gives_the_gpus(tmp_path: Path, gpu: str,
                                                     flag: str | None) -> None:
    FACTS["gpu-" + gpu] = f'runtime = "apptainer"\napptainer_gpu = "{gpu}"\n'
    try:
        line = launcher_line(render_script(spec("c-gpu-" + gpu, {"image": "/i.sif"}),
                                           [site(tmp_path)]))
    finally:
        del FACTS["gpu-" + gpu]
    assert "--nv " not in line and (flag is None or f"exec {flag} --bind" in line), line


def probed(tmp_path: Path, partition: str, setup: tuple[str, ...] = (), **env: str) -> Any:
    """A one-node srun job whose command notes the job-private cache directory as it finds
    it (its mode; "-" when there is none), then records its argv and environment."""
    probe = tmp_path / "probe.sh"
    probe.write_text('#!/bin/bash\nstat -c %a "${HPCTRAIN_CONTAINER_CACHE:-/nonexistent}" '
                     '> "$STANDIN_LOG/cache.mode" 2>/dev/null \\\n'
                     '  || echo - > "$STANDIN_LOG/cache.mode"\n'
                     f'exec {tmp_path}/standin-bin/argv-recorder "$@"\n')
    probe.chmod(0o755)
    s = spec(partition, {"image": "/i.sqsh", "writable": False}, nodes=1,
             run={"launcher": "srun", "command": [str(probe), "a b"], "setup": list(setup)})
    return run_script(render_script(s, [site(tmp_path)], python=sys.executable), tmp_path, **env)


def test_where_the_runtime_mounts_no_home_models_are_the_users_and_scratch_the_jobs(
        tmp_path: Path) -> None:
    FACTS["nohome"] = 'runtime = "pyxis"\nhome = false\n'
    hf = tmp_path / ".cache" / "huggingface"      # HOME is tmp_path: the user's own cache
    hf.mkdir(parents=True)
    (hf / "token").write_text("hf_secret\n")      # huggingface-cli login wrote it
    try:
        run = probed(tmp_path, "c-nohome", TRITON_CACHE_DIR="/mine/triton")
        mounts = run.read("pyxis.args").splitlines()
        env = dict(e.split("=", 1) for e in run.nul_list("command.env"))
        mode = run.read("cache.mode").strip()
        (hf / "hub").mkdir()                      # a model the first job downloaded
        again = probed(tmp_path, "c-nohome", SLURM_JOB_ID="4343")
    finally:
        del FACTS["nohome"]
    assert run.returncode == 0 and again.returncode == 0, run.stderr + again.stderr
    cache = tmp_path / ".hpctrain-cache" / "4242"
    torch_home = tmp_path / ".cache" / "torch"
    assert [m for m in mounts if m.startswith("mount ")][-3:] == [
        f"mount {cache} {cache} rw", f"mount {hf} {hf} rw",
        f"mount {torch_home} {torch_home} rw"], mounts
    # the user's model caches, where Hugging Face and torch put them: the same for every
    # job, and the login's token is found there
    assert env["HF_HOME"] == str(hf) and env["TORCH_HOME"] == str(torch_home)
    assert (Path(env["HF_HOME"]) / "token").read_text() == "hf_secret\n"
    env2 = dict(e.split("=", 1) for e in again.nul_list("command.env"))
    assert env2["HF_HOME"] == str(hf) and (Path(env2["HF_HOME"]) / "hub").is_dir()
    # the job's scratch: private while it runs, gone once the job ended for good
    assert mode == "700"
    assert env["TRITON_CACHE_DIR"] == "/mine/triton"           # the job's own is kept
    assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{cache}/torchinductor_cache_dir"
    assert env["XDG_CACHE_HOME"] == f"{cache}/xdg_cache_home"
    assert not cache.exists() and not cache.parent.exists()
    assert f"removed the job's cache directory {cache} (the job ended: finish)" in run.stderr


@pytest.mark.parametrize("partition", ["c-pyxis", "c-nohome"])
def test_the_users_own_hf_home_and_token_path_are_honoured(tmp_path: Path,
                                                            partition: str) -> None:
    FACTS["nohome"] = 'runtime = "pyxis"\nhome = false\n'
    hf, token = tmp_path / "scratch" / "hf", tmp_path / "secrets" / "hf_token"
    token.parent.mkdir()
    token.write_text("hf_secret\n")
    try:
        run = probed(tmp_path, partition, HF_HOME=str(hf), HF_TOKEN_PATH=str(token))
    finally:
        del FACTS["nohome"]
    assert run.returncode == 0, run.stderr
    env = dict(e.split("=", 1) for e in run.nul_list("command.env"))
    assert env["HF_HOME"] == str(hf) and env["HF_TOKEN_PATH"] == str(token)
    mounts = run.read("pyxis.args").splitlines()
    assert f"mount {hf} {hf} rw" in mounts and f"mount {token} {token} ro" in mounts
    assert hf.is_dir()                        # made (the user's, kept) for the mount
    # where the runtime mounts the home, nothing else is added: no TORCH_HOME, no scratch
    if partition == "c-pyxis":
        assert not any(".cache" in m or "hpctrain-cache" in m for m in mounts)
        assert "TORCH_HOME" not in env and run.read("cache.mode").strip() == "-"


def test_a_cache_path_no_mount_list_can_hold_is_not_mounted_and_the_log_says_so(
        tmp_path: Path) -> None:
    run = probed(tmp_path, "c-pyxis", HF_HOME=str(tmp_path / "a,b"))
    assert run.returncode == 0, run.stderr
    assert f"warning: {tmp_path}/a,b is not mounted into the container" in run.stderr
    assert not any("a,b" in m for m in run.read("pyxis.args").splitlines())


def test_a_job_that_ends_before_the_hand_over_leaves_no_scratch(tmp_path: Path) -> None:
    FACTS["nohome"] = 'runtime = "pyxis"\nhome = false\n'
    try:
        run = probed(tmp_path, "c-nohome", setup=(
            'test -d "$HPCTRAIN_CONTAINER_CACHE" && touch "$STANDIN_LOG/was-there"', "false"))
    finally:
        del FACTS["nohome"]
    assert run.returncode == 1 and "setup line failed" in run.stderr, run.stderr
    assert (run.log / "was-there").exists()
    assert not (tmp_path / ".hpctrain-cache" / "4242").exists()
    assert (tmp_path / ".cache" / "huggingface").is_dir()     # the user's: kept


PAYLOADS = ["$(touch {m})", "`touch {m}`", "'; touch {m}; '", "x; touch {m}", "x\ntouch {m}",
            "/a,/b:/c", "/a:$(touch {m})", "/a;touch {m}", "/a b", "--bind=/etc"]


@pytest.mark.parametrize("key", ["image", "mounts", "workdir", "env"])
def test_hostile_container_values_are_refused_or_inert(tmp_path: Path, key: str) -> None:
    marker = tmp_path / "PWNED"
    for template in PAYLOADS:
        payload = template.format(m=marker)
        container: dict[str, Any] = {"image": "/img/pt.sif"}
        container[key] = [payload] if key in ("mounts", "env") else payload
        try:
            run = stood_in(tmp_path, "c-apptainer", container)
        except SpecError:
            continue
        assert not marker.exists(), f"container.{key}={payload!r} was executed"
        assert run.returncode == 0, run.stderr


# ---- the supervisor's bundle for Slurm's OCI containers -------------------------------------
IMAGE = {"ociVersion": "1.0.2", "root": {"path": "rootfs", "readonly": False},
         "process": {"cwd": "/", "args": ["sh"]},
         "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                    {"destination": "/data", "type": "bind", "source": "/data",
                     "options": ["rbind", "rw"]}]}


def test_bundle_config_adds_the_jobs_mounts_and_working_directory() -> None:
    plan = {"runtime": "oci", "image": "/images/pt", "writable": False, "workdir": None,
            "mounts": ["/ds:/ds:ro", "/data:/data", "/ck:/ck"]}
    entries = [("etc", "dir"), ("proc", "dir"), ("usr", "dir"), ("hosts", "file")]
    config = bundle_config(IMAGE, "/images/pt", plan, "/home/u/proj", entries)
    # Slurm 22.05 runs <bundle>/rootfs whatever the config says: a root of mount points
    assert config["root"] == {"path": "rootfs", "readonly": True}
    assert config["process"]["cwd"] == "/home/u/proj"
    mounts = [(m["source"], m["destination"], m.get("options")) for m in config["mounts"]]
    assert mounts == [
        ("/images/pt/rootfs/etc", "/etc", ["rbind", "ro"]),     # the image's root, first
        ("/images/pt/rootfs/usr", "/usr", ["rbind", "ro"]),
        ("/images/pt/rootfs/hosts", "/hosts", ["rbind", "ro"]),
        ("proc", "/proc", None), ("/data", "/data", ["rbind", "rw"]),   # the image's mounts
        ("/ds", "/ds", ["rbind", "ro"]), ("/ck", "/ck", ["rbind", "rw"]),
        ("/home/u/proj", "/home/u/proj", ["rbind", "rw"])]       # /data: the image's own
    assert IMAGE["root"]["path"] == "rootfs"   # the image's own config is left alone
    writable = bundle_config(IMAGE, "/i", {**plan, "workdir": "/code", "writable": True}, "/s",
                             entries)
    assert writable["process"]["cwd"] == "/code" and writable["root"]["readonly"] is False
    assert writable["mounts"][0]["options"] == ["rbind", "rw"]


def test_a_rootless_bundle_for_an_ordinary_user() -> None:
    """Slurm runs runc as the job's user: a user namespace in which the user is root (runc
    1.1 wants root mapped), and only mounts a user namespace may make (runc spec --rootless)."""
    image = {**IMAGE, "process": {"user": {"uid": 0, "gid": 0}},
             "linux": {"namespaces": [{"type": "mount"}]},
             "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
                         "options": ["nosuid", "ro"]},
                        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup"},
                        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
                        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                         "options": ["nosuid", "newinstance", "gid=5"]},
                        {"destination": "/root", "type": "bind", "source": "/root",
                         "options": ["rbind", "rw"]},
                        {"destination": "/data", "type": "bind", "source": "/data",
                         "options": ["rbind", "ro"]}]}
    config = rootless(image, 1001, 1002, reachable=lambda p: p != "/root")
    assert config["linux"]["namespaces"] == [{"type": "mount"}, {"type": "user"}]
    assert config["linux"]["uidMappings"] == [{"containerID": 0, "hostID": 1001, "size": 1}]
    assert config["linux"]["gidMappings"] == [{"containerID": 0, "hostID": 1002, "size": 1}]
    assert config["process"]["user"] == {"uid": 0, "gid": 0}
    assert [(m["destination"], m["type"], m.get("source"), m.get("options"))
            for m in config["mounts"]] == [
        ("/proc", "bind", "/proc", ["rbind", "nosuid", "noexec", "nodev"]),
        ("/sys", "bind", "/sys", ["rbind", "nosuid", "noexec", "nodev", "ro"]),
        ("/dev/pts", "devpts", "devpts", ["nosuid", "newinstance"]),
        ("/data", "bind", "/data", ["rbind", "ro"])]   # no cgroup, mqueue, unreachable /root
    assert image["process"]["user"] == {"uid": 0, "gid": 0}  # the image is left alone


def test_step_argv_writes_the_bundle_and_points_srun_at_it(tmp_path: Path) -> None:
    image = tmp_path / "image"
    (image / "rootfs" / "usr").mkdir(parents=True)
    (image / "rootfs" / "bin").symlink_to("usr/bin")
    (image / "rootfs" / "hosts").write_text("x")
    (image / "config.json").write_text(json.dumps(IMAGE))
    plan = {"runtime": "oci", "image": str(image), "mounts": [], "workdir": None,
            "writable": False}
    argv = ["srun", f"--container={image}", "--nodes=2", "torchrun", "x.py"]
    state = tmp_path / "state"
    new, notes = step_argv(argv, plan, state, str(tmp_path))
    assert new == ["srun", f"--container={state / 'container'}", "--nodes=2", "torchrun",
                   "x.py"]
    written = json.loads((state / "container" / "config.json").read_text())
    rootfs = state / "container" / "rootfs"
    assert written["root"]["path"] == "rootfs" and (rootfs / "usr").is_dir()
    assert os.readlink(rootfs / "bin") == "usr/bin" and (rootfs / "hosts").is_file()
    assert {m["destination"] for m in written["mounts"]} >= {"/usr", "/hosts", "/proc"}
    assert "/bin" not in {m["destination"] for m in written["mounts"]}
    assert notes[0].startswith("container: Slurm OCI bundle") and "hpctrain" in notes[1]
    assert step_argv(argv, {**plan, "runtime": "pyxis"}, state, "")[0] == argv
    assert step_argv(argv, None, state, "") == (argv, [])
    with pytest.raises(SupervisorError, match="is not an OCI bundle"):
        step_argv(["srun", "--container=/nope"], {**plan, "image": "/nope"}, state, "")


def test_partition_dataclass_keeps_facts_optional() -> None:
    part = Partition.from_dict({"name": "p", "gpus_per_node": 1, "cpus_per_node": 1,
                                "mem_per_node_gb": 1})
    assert part.container is None


def test_where_the_ranks_find_hpctrain(tmp_path: Path) -> None:
    assert "mounted in from the host" in hpctrain_inside("/work/main/hpctrain",
                                                         [("/work", "/work")])
    assert "neither in the image nor mounted" in hpctrain_inside(
        "/opt/x/hpctrain", [("/work", "/work")], str(tmp_path))
    (tmp_path / "opt" / "x" / "hpctrain").mkdir(parents=True)
    assert "is in the image" in hpctrain_inside("/opt/x/hpctrain", [], str(tmp_path))
    opaque = hpctrain_inside("/opt/x/hpctrain", [("/data", "/d")])
    assert "unless the image has it" in opaque and 'mounts = ["/opt/x/hpctrain"]' in opaque


def test_the_runtime_does_not_trust_the_node_name_in_an_oci_container_step() -> None:
    from hpctrain.runtime.environment import Environment

    env = {"RANK": "2", "WORLD_SIZE": "4", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}
    assert Environment.from_env({**env, "SLURM_PROCID": "1"}).node == "n1"
    # Slurm 22.05's container step: every node's task gets task 0's Slurm variables
    assert Environment.from_env({**env, "SLURM_CONTAINER": "/b", "SLURM_PROCID": "0"}).node \
        is None
