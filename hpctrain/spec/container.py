"""Containers: the job's ``[container]`` table and the partition's container facts.

A job says *what* runs in a container (the image, extra mounts, the working directory,
which host variables win over the image's, whether the root file system is writable);
the partition's sysadmins say *how* their site runs containers (``pyxis`` for NVIDIA's
pyxis/enroot, ``apptainer``, ``oci`` for Slurm's own ``srun --container``), which images
are allowed, which mounts every job gets and whether containers are required.
:func:`hpctrain.render.script.render` joins the two (docs/containers.md). Pure.

Every value ends up in a launcher word or a runtime's comma/colon-separated list, so
paths are held to characters those lists cannot misread: no commas, colons or
whitespace inside a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from hpctrain.errors import PartitionError, SpecError
from hpctrain.spec.checks import ENV_KEY_RE, check_table

RUNTIMES = ("pyxis", "apptainer", "oci")
# how apptainer gives a container the node's GPUs: --nv (the NVIDIA libraries bound in),
# --nvccli (nvidia-container-cli, where a site set it up), or not at all
APPTAINER_GPU = {"nv": "--nv", "nvccli": "--nvccli", "none": ""}
# images apptainer converts on every `exec`: pulled once into a SIF instead
REGISTRY = ("docker://", "oras://", "library://", "shub://", "docker-daemon://")
# the registry references whose tag is asked for its digest at every job start (skopeo
# speaks docker's registry protocol only), so that a moved tag is pulled again
DIGEST_CHECKED = "docker://"
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# the user's model caches (variable, the folder under ~/.cache the library uses by
# default): downloads kept per user, across jobs, mounted into the container at their own
# path, as the libraries on the host would use them (Hugging Face's token is in HF_HOME)
MODEL_CACHES = (("HF_HOME", "huggingface"), ("TORCH_HOME", "torch"))
# scratch a training stack writes under $HOME (compiled kernels, pip's downloads); where
# the runtime mounts no home it goes to a job-private directory instead (unless the job's
# environment names one), removed when the job ends for good
CACHE_VARIABLES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "PIP_CACHE_DIR",
                   "XDG_CACHE_HOME")
# registry references (enroot's [USER@][REGISTRY#]IMAGE[:TAG], docker://..., oras://...)
# and paths (squashfs, sif, an OCI bundle directory)
IMAGE_RE = re.compile(r"^[A-Za-z0-9_./][A-Za-z0-9_.:/@#+-]*$")
PATH_RE = re.compile(r"^/[A-Za-z0-9_./+@%=-]*$")
MOUNT_FLAGS = ("ro", "rw")


@dataclass(frozen=True)
class Mount:
    """``source`` on the host at ``target`` in the container, read-only when ``ro``."""

    source: str
    target: str
    ro: bool = False

    def __str__(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.ro else "")


def parse_mount(value: Any, where: str) -> Mount:
    """``/src``, ``/src:/dst`` or ``/src:/dst:ro`` (``rw`` also accepted) -> :class:`Mount`."""
    if not isinstance(value, str):
        raise SpecError(f"{where}={value!r} must be a string such as \"/data:/data:ro\"")
    parts = value.split(":")
    if len(parts) > 3 or not parts[0]:
        raise SpecError(f"{where}={value!r}: write source[:target[:ro]], e.g. "
                        "\"/lustre/data:/data:ro\"")
    source, target = parts[0], parts[1] if len(parts) > 1 and parts[1] else parts[0]
    flag = parts[2] if len(parts) == 3 else "rw"
    for role, path in (("source", source), ("target", target)):
        if not PATH_RE.match(path) or ".." in path.split("/"):
            raise SpecError(f"{where}={value!r}: the {role} {path!r} must be an absolute path "
                            "without commas, colons, spaces or '..' (container runtimes "
                            "split mount lists on , and :)")
    if flag not in MOUNT_FLAGS:
        raise SpecError(f"{where}={value!r}: the flag {flag!r} is not one of "
                        f"{', '.join(MOUNT_FLAGS)}")
    return Mount(source, target, flag == "ro")


def _mounts(value: Any, where: str) -> tuple[Mount, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise SpecError(f"{where}={value!r} must be a list, e.g. "
                        f'{where} = ["/lustre/data:/data:ro"]')
    return tuple(parse_mount(v, f"{where}[{i}]") for i, v in enumerate(value))


def check_image(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or not IMAGE_RE.match(value):
        raise SpecError(f"{where}={value!r} is not an image: give a registry reference "
                        "(nvcr.io#nvidia/pytorch:24.05-py3, docker://...) or an absolute "
                        "path (a .sqsh, .sif or OCI bundle directory)")
    return value


@dataclass(frozen=True)
class ContainerSpec:
    """The job's ``[container]`` table (docs/containers.md)."""

    image: str
    mounts: tuple[Mount, ...] = ()
    workdir: str | None = None        # None: the job's workdir, else the submit directory
    env: tuple[str, ...] = ()         # host variables whose values win over the image's
    writable: bool | None = None      # a writable root file system; None: the site's default

    @classmethod
    def from_dict(cls, data: Any) -> "ContainerSpec":
        data = check_table(data, "container", cls)
        if "image" not in data:
            raise SpecError('container.image is missing: add image = "..." under [container]')
        workdir = data.get("workdir")
        if workdir is not None and (not isinstance(workdir, str) or not PATH_RE.match(workdir)):
            raise SpecError(f"container.workdir={workdir!r} must be an absolute path without "
                            "commas, colons or spaces")
        env = data.get("env", [])
        if isinstance(env, str) or not isinstance(env, Sequence) or not all(
                isinstance(n, str) and ENV_KEY_RE.match(n) for n in env):
            raise SpecError(f"container.env={env!r} must be a list of variable names, e.g. "
                            'env = ["NCCL_DEBUG", "WANDB_PROJECT"]')
        writable = data.get("writable")
        if writable is not None and not isinstance(writable, bool):
            raise SpecError(f"container.writable={writable!r} must be true or false")
        return cls(image=check_image(data["image"], "container.image"),
                   mounts=_mounts(data.get("mounts", []), "container.mounts"),
                   workdir=workdir, env=tuple(env), writable=writable)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"image": self.image, "mounts": [str(m) for m in self.mounts],
                               "env": list(self.env)}
        if self.writable is not None:
            out["writable"] = self.writable
        if self.workdir is not None:
            out["workdir"] = self.workdir
        return out


@dataclass(frozen=True)
class ContainerFacts:
    """A partition's ``[container]`` table, kept by its sysadmins."""

    runtime: str
    image_prefixes: tuple[str, ...] = ()   # allowed image prefixes; empty: any image
    mounts: tuple[Mount, ...] = ()         # mounted into every job's container
    required: bool = False                 # jobs on this partition must use a container
    apptainer: str = "apptainer"           # the apptainer binary (apptainer or singularity)
    apptainer_gpu: str = "nv"              # nv (--nv), nvccli (--nvccli) or none
    # where apptainer keeps the SIFs of registry images, one per digest (storage every
    # node sees); "": the job's submit directory, under .hpctrain-sif/
    sif_dir: str = ""
    home: bool = True                      # the runtime mounts the user's home (site default)

    @classmethod
    def from_dict(cls, data: Any, source: str) -> "ContainerFacts":
        if not isinstance(data, Mapping):
            raise PartitionError(f"{source}: container must be a table ([container])")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PartitionError(f"{source}: unknown key(s) container.{', container.'.join(unknown)}"
                                 f"; valid keys: {', '.join(sorted(known))}")
        runtime = data.get("runtime")
        if runtime not in RUNTIMES:
            raise PartitionError(f"{source}: container.runtime={runtime!r}: use one of "
                                 f"{', '.join(RUNTIMES)}")
        prefixes = data.get("image_prefixes", [])
        if isinstance(prefixes, str) or not all(isinstance(p, str) and p for p in prefixes):
            raise PartitionError(f"{source}: container.image_prefixes={prefixes!r} must be a "
                                 "list of strings")
        try:
            mounts = _mounts(data.get("mounts", []), "container.mounts")
        except SpecError as exc:
            raise PartitionError(f"{source}: {exc}") from None
        required = data.get("required", False)
        apptainer = data.get("apptainer", "apptainer")
        if not isinstance(required, bool) or not isinstance(apptainer, str) or not apptainer:
            raise PartitionError(f"{source}: container.required must be true or false and "
                                 "container.apptainer a program name")
        gpu = data.get("apptainer_gpu", "nv")
        if gpu not in APPTAINER_GPU:
            raise PartitionError(f"{source}: container.apptainer_gpu={gpu!r}: use one of "
                                 f"{', '.join(APPTAINER_GPU)}")
        sif_dir, home = data.get("sif_dir", ""), data.get("home", True)
        if not isinstance(sif_dir, str) or (sif_dir and not PATH_RE.match(sif_dir)):
            raise PartitionError(f"{source}: container.sif_dir={sif_dir!r} must be an absolute "
                                 "path on storage every node sees")
        if not isinstance(home, bool):
            raise PartitionError(f"{source}: container.home={home!r} must be true or false")
        return cls(runtime=runtime, image_prefixes=tuple(prefixes), mounts=mounts,
                   required=required, apptainer=apptainer, apptainer_gpu=gpu,
                   sif_dir=sif_dir, home=home)


@dataclass(frozen=True)
class ContainerPlan:
    """What the launcher templates need to run the step in the partition's runtime."""

    runtime: str
    image: str
    mounts: tuple[Mount, ...]
    workdir: str | None
    env: tuple[str, ...]
    writable: bool | None              # None: the runtime's (the site's) default
    apptainer: str = "apptainer"
    apptainer_gpu: str = "nv"
    sif_dir: str = ""
    home: bool = True

    @property
    def pulls(self) -> bool:
        """Whether the job converts its image to a SIF once, before the step (apptainer
        with a registry image: each `apptainer exec` would convert it, once per rank)."""
        return self.runtime == "apptainer" and self.image.startswith(REGISTRY)

    @property
    def sif_name(self) -> str:
        """The file for the SIF last run for this reference, whatever its digest (a hash of
        the reference): a link to the digest's SIF, or the SIF itself where the digest is
        not known (an ``oras://`` reference). A job that cannot reach the registry runs it."""
        import hashlib
        return hashlib.sha256(self.image.encode()).hexdigest()[:20] + ".sif"

    @property
    def checks_digest(self) -> bool:
        """Whether the job asks the registry which image the tag names now (``skopeo
        inspect``) and runs the SIF of that digest: a moved tag (``:latest``) is pulled
        again, an unchanged one never twice."""
        return self.pulls and self.image.startswith(DIGEST_CHECKED)

    @property
    def pinned_digest(self) -> str | None:
        """The digest the reference names itself (``docker://repo@sha256:...``): nothing to
        ask the registry. None for a tag."""
        _, at, digest = self.image.partition("@")
        return digest if at and self.checks_digest and DIGEST_RE.match(digest) else None

    @property
    def repository(self) -> str:
        """The reference without its tag or digest (``docker://nvcr.io/nvidia/pytorch``):
        the image is pulled as ``repository@digest``, the digest just asked for, so the SIF
        named by a digest holds that image even when the tag moves during the pull. A
        colon before the last ``/`` is a registry's port, not a tag."""
        ref = self.image.partition("@")[0]
        scheme = ref.find("://") + 3
        colon, slash = ref.rfind(":"), ref.rfind("/")
        return ref[:colon] if colon > max(slash, scheme - 1) else ref

    @staticmethod
    def digest_sif(digest: str) -> str:
        """The SIF file of one image digest: ``sha256-<hex>.sif``."""
        return digest.replace(":", "-", 1) + ".sif"

    @property
    def mounts_csv(self) -> str:
        """``a:a,b:/b:ro,`` (trailing comma: the template appends the submit directory)."""
        return "".join(f"{m.source}:{m.target}{':ro' if m.ro else ''}," for m in self.mounts)

    @property
    def env_csv(self) -> str:
        return ",".join(self.env)

    def to_json(self) -> dict[str, Any]:
        """What the job supervisor reads (HPCTRAIN_CONTAINER): it builds an OCI bundle."""
        return {"runtime": self.runtime, "image": self.image,
                "mounts": [str(m) for m in self.mounts], "workdir": self.workdir,
                "writable": bool(self.writable)}


def plan_container(spec_container: ContainerSpec | None, facts: ContainerFacts | None,
                   partition: str, *, launcher: str, checkpoint_dir: str | None,
                   workdir: str | None) -> ContainerPlan | None:
    """Join the job's container with its partition's facts, or say why they do not fit.

    The checkpoint dir and the job's workdir are mounted at their own paths (the submit
    directory too, by the templates: its path is known only when the job runs)."""
    if spec_container is None:
        if facts is not None and facts.required:
            raise SpecError(f"partition {partition!r} runs jobs only in containers: add a "
                            "[container] table with image = ... (docs/containers.md)")
        return None
    if facts is None:
        raise SpecError(f"partition {partition!r} has no container runtime (its facts file "
                        "has no [container] table): drop [container] from the spec, pick "
                        "another partition, or ask the sysadmins to declare the runtime")
    image = spec_container.image
    if facts.image_prefixes and not image.startswith(facts.image_prefixes):
        raise SpecError(f"container.image={image!r} is not allowed on partition "
                        f"{partition!r}: use an image starting with "
                        f"{' or '.join(repr(p) for p in facts.image_prefixes)}")
    if facts.runtime == "oci" and launcher != "torchrun":
        raise SpecError(f"partition {partition!r} runs Slurm's OCI containers, which start "
                        "one task per node and give every node's task the same Slurm "
                        f"variables (SLURM_PROCID=0 everywhere), so launcher={launcher!r} "
                        "cannot number the ranks: use launcher = \"torchrun\" (one agent "
                        "per node starts the ranks inside the container and numbers them)")
    mounts: list[Mount] = [*facts.mounts, *spec_container.mounts]
    for key, path in (("checkpoint.dir", checkpoint_dir), ("workdir", workdir)):
        if not path:
            continue
        if not PATH_RE.match(path):
            raise SpecError(f"{key}={path!r} cannot be mounted into the container (runtimes "
                            "split mount lists on , and :): choose a path without commas, "
                            "colons or spaces")
        if all(m.target != path for m in mounts):
            mounts.append(Mount(path, path))
    # the tasks start where they would without a container: the job's workdir, else (the
    # templates and the supervisor fill it in) the submit directory
    return ContainerPlan(runtime=facts.runtime, image=image, mounts=tuple(mounts),
                         workdir=spec_container.workdir or workdir, env=spec_container.env,
                         writable=spec_container.writable, apptainer=facts.apptainer,
                         apptainer_gpu=facts.apptainer_gpu, sif_dir=facts.sif_dir,
                         home=facts.home)
