"""The words that run a launcher's tasks in the partition's container runtime. Pure.

Each runtime takes the container differently (flags checked against the upstream
documentation, docs/containers.md has the sources):

- ``pyxis`` (NVIDIA pyxis/enroot): flags of ``srun`` itself: ``--container-image``,
  ``--container-mounts=SRC:DST[:FLAGS],...``, ``--container-workdir``,
  ``--container-env=NAME,...`` (host values that win over the image's),
  ``--container-writable``/``--container-readonly``, ``--no-container-mount-home``;
- ``apptainer``: every task runs ``apptainer exec --bind SRC:DST[:ro],... --pwd DIR
  [--writable-tmpfs] IMAGE`` before its command; host variables that must win over the
  image's are exported as ``APPTAINERENV_NAME`` by the script;
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
from hpctrain.spec.container import ContainerPlan

SUBMIT_DIR = '"$SLURM_SUBMIT_DIR"'
SUBMIT_MOUNT = '"$SLURM_SUBMIT_DIR:$SLURM_SUBMIT_DIR"'


@dataclass(frozen=True)
class ContainerWords:
    """Shell text for the launcher templates, each empty or ending in a space."""

    srun: ShellSafe = ShellSafe("")   # after ``srun``, before its own options
    wrap: ShellSafe = ShellSafe("")   # before each task's command


def container_words(plan: ContainerPlan | None) -> ContainerWords:
    """The words for ``plan``'s runtime; none without a container."""
    if plan is None:
        return ContainerWords()
    return {"pyxis": _pyxis, "apptainer": _apptainer, "oci": _oci}[plan.runtime](plan)


def _join(words: list[str]) -> ShellSafe:
    return ShellSafe("".join(w + " " for w in words))


def _workdir(flag: str, plan: ContainerPlan) -> str:
    return shq(flag + plan.workdir) if plan.workdir else flag + SUBMIT_DIR


def _pyxis(plan: ContainerPlan) -> ContainerWords:
    words = [shq("--container-image=" + plan.image),
             shq("--container-mounts=" + plan.mounts_csv) + SUBMIT_MOUNT,
             _workdir("--container-workdir=", plan),
             "--no-container-mount-home",
             "--container-writable" if plan.writable else "--container-readonly"]
    if plan.env:
        words.append(shq("--container-env=" + plan.env_csv))
    return ContainerWords(srun=_join(words))


def _apptainer(plan: ContainerPlan) -> ContainerWords:
    words = [shq(plan.apptainer), "exec", "--bind", shq(plan.mounts_csv) + SUBMIT_MOUNT,
             "--pwd", shq(plan.workdir) if plan.workdir else SUBMIT_DIR]
    if plan.writable:
        words.append("--writable-tmpfs")
    words.append(shq(plan.image))
    return ContainerWords(wrap=_join(words))


def _oci(plan: ContainerPlan) -> ContainerWords:
    return ContainerWords(srun=_join([shq("--container=" + plan.image)]))


def apptainer_env(plan: ContainerPlan | None) -> list[str]:
    """Variable names the script re-exports as ``APPTAINERENV_<NAME>="$NAME"``."""
    return list(plan.env) if plan is not None and plan.runtime == "apptainer" else []
