"""The words that run a launcher's tasks in the partition's container runtime. Pure.

Each runtime takes the container differently (flags checked against the upstream
documentation, docs/containers.md has the sources):

- ``pyxis`` (NVIDIA pyxis/enroot): flags of ``srun`` itself: ``--container-image``,
  ``--container-mounts=SRC:DST[:FLAGS],...``, ``--container-workdir``,
  ``--container-name`` (per job: a restart in the allocation reuses the imported image
  instead of importing it again on every node), ``--container-env=NAME,...`` (host values
  that win over the image's), ``--container-writable``/``--container-readonly`` only when
  the spec says (else the site's default, as its home mount is);
- ``apptainer``: every task runs ``apptainer exec --nv --bind SRC:DST[:ro],... --pwd DIR
  [--writable-tmpfs] IMAGE`` before its command (``--nv``: the node's GPUs, or
  ``--nvccli`` where the site says); a registry image (``docker://...``) is pulled into a
  SIF once per job before the step, as each ``exec`` would convert it again, once per rank;
  host variables that must win over the image's are exported as ``APPTAINERENV_NAME``;
- ``oci`` (Slurm's own ``srun --container=BUNDLE``): one flag; mounts and the working
  directory go into a per-job bundle that the job supervisor writes from the image's
  (``hpctrain.supervisor.container``), because srun takes no mount option.

The submit directory is mounted (and is the working directory unless ``workdir`` says
otherwise) at its own path, so ``python train.py`` finds the script as it would without a
container; its path is known only when the job runs, hence ``"$SLURM_SUBMIT_DIR"`` in the
words. Everything else is quoted by :func:`hpctrain.render.shell.shq`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.render.shell import ShellSafe, shq
from hpctrain.spec.container import APPTAINER_GPU, CACHE_VARIABLES, ContainerPlan

SUBMIT_DIR = '"$SLURM_SUBMIT_DIR"'
SUBMIT_MOUNT = '"$SLURM_SUBMIT_DIR:$SLURM_SUBMIT_DIR"'
SIF = '"$HPCTRAIN_SIF"'
CACHE = "HPCTRAIN_CONTAINER_CACHE"
CACHE_MOUNT = f'",${CACHE}:${CACHE}"'


@dataclass(frozen=True)
class ContainerWords:
    """Shell text for the launcher templates, each empty or ending in a space."""

    srun: ShellSafe = ShellSafe("")   # after ``srun``, before its own options
    wrap: ShellSafe = ShellSafe("")   # before each task's command
    wrap_count: int = 0               # the shell words in ``wrap``


def container_words(plan: ContainerPlan | None) -> ContainerWords:
    """The words for ``plan``'s runtime; none without a container."""
    if plan is None:
        return ContainerWords()
    return {"pyxis": _pyxis, "apptainer": _apptainer, "oci": _oci}[plan.runtime](plan)


def _join(words: list[str]) -> ShellSafe:
    return ShellSafe("".join(w + " " for w in words))


def _workdir(flag: str, plan: ContainerPlan) -> str:
    return shq(flag + plan.workdir) if plan.workdir else flag + SUBMIT_DIR


def _mounts(plan: ContainerPlan) -> str:
    listed = shq(plan.mounts_csv) if plan.mounts_csv else ""
    return listed + SUBMIT_MOUNT + ("" if plan.home else CACHE_MOUNT)


def _pyxis(plan: ContainerPlan) -> ContainerWords:
    words = [shq("--container-image=" + plan.image),
             shq("--container-mounts=") + _mounts(plan),
             _workdir("--container-workdir=", plan),
             '"--container-name=hpctrain-$SLURM_JOB_ID"']
    if plan.writable is not None:
        words.append("--container-writable" if plan.writable else "--container-readonly")
    if plan.env:
        words.append(shq("--container-env=" + plan.env_csv))
    return ContainerWords(srun=_join(words))


def _apptainer(plan: ContainerPlan) -> ContainerWords:
    gpu = APPTAINER_GPU[plan.apptainer_gpu]
    words = [shq(plan.apptainer), "exec", *([gpu] if gpu else []), "--bind", _mounts(plan),
             "--pwd", shq(plan.workdir) if plan.workdir else SUBMIT_DIR]
    if plan.writable:
        words.append("--writable-tmpfs")
    words.append(SIF if plan.pulls else shq(plan.image))
    return ContainerWords(wrap=_join(words), wrap_count=len(words))


def container_setup(plan: ContainerPlan | None) -> list[ShellSafe]:
    """Script lines before the hand-over: the image pulled once per job into a SIF (apptainer
    with a registry image); the job-private cache directory where the runtime mounts no home
    (what Triton, inductor, Hugging Face and pip write there; a variable the job's
    environment sets is kept)."""
    lines: list[str] = []
    if plan is not None and plan.pulls:
        where = shq(plan.sif_dir) if plan.sif_dir else '"$SLURM_SUBMIT_DIR/.hpctrain-sif"'
        tmp = '"$HPCTRAIN_SIF.$SLURM_JOB_ID.tmp.sif"'
        lines += [
            "# the image as one SIF for the job, on storage every node reads: `apptainer exec`",
            "# of a registry image would convert it again for every rank",
            f"export HPCTRAIN_SIF={where}/{shq(plan.sif_name)}",
            'if [[ ! -s $HPCTRAIN_SIF ]]; then',
            f'  mkdir -p -- "${{HPCTRAIN_SIF%/*}}" && {shq(plan.apptainer)} pull {tmp} '
            f"{shq(plan.image)} && mv -f -- {tmp} {SIF} \\",
            f'    || {{ echo "hpctrain: "{shq(plan.apptainer)}" pull "{shq(plan.image)}" failed" '
            ">&2; exit 1; }",
            "fi"]
    if plan is not None and not plan.home and plan.runtime != "oci":
        lines += [
            "# the runtime mounts no home here: caches written under it go to a job-private",
            "# directory, mounted into the container (a variable the job sets is kept)",
            f'export {CACHE}="$SLURM_SUBMIT_DIR/.hpctrain-cache/$SLURM_JOB_ID"',
            f'mkdir -p -m 700 -- "${CACHE}" || {{ echo "hpctrain: cannot create ${CACHE}" >&2; '
            "exit 1; }"]
        lines += [f': "${{{v}:=${CACHE}/{v.lower()}}}"; export {v}' for v in CACHE_VARIABLES]
    return [ShellSafe(line) for line in lines]


def _oci(plan: ContainerPlan) -> ContainerWords:
    return ContainerWords(srun=_join([shq("--container=" + plan.image)]))


def apptainer_env(plan: ContainerPlan | None) -> list[str]:
    """Variable names the script re-exports as ``APPTAINERENV_<NAME>="$NAME"``."""
    return list(plan.env) if plan is not None and plan.runtime == "apptainer" else []
