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
  SIF before the step, as each ``exec`` would convert it again, once per rank: one SIF per
  image digest, the tag asked for its digest at every job start (a moved tag is pulled
  again, an unchanged one never twice); host variables that must win over the image's are
  exported as ``APPTAINERENV_NAME``;
- ``oci`` (Slurm's own ``srun --container=BUNDLE``): one flag; mounts and the working
  directory go into a per-job bundle that the job supervisor writes from the image's
  (``hpctrain.supervisor.container``), because srun takes no mount option.

The submit directory is mounted (and is the working directory unless ``workdir`` says
otherwise) at its own path, so ``python train.py`` finds the script as it would without a
container; its path is known only when the job runs, hence ``"$SLURM_SUBMIT_DIR"`` in the
words. So are the caches mounted for pyxis and apptainer (``$HPCTRAIN_CACHE_MOUNTS``, made
by :func:`container_setup`): the user's model caches (``HF_HOME``, ``TORCH_HOME``: the
job's values, else where the libraries put them by default) and, where the runtime mounts
no home, the job-private scratch directory. Everything else is quoted by
:func:`hpctrain.render.shell.shq`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain import protocol
from hpctrain.render.shell import ShellSafe, shq
from hpctrain.spec.container import (APPTAINER_GPU, CACHE_VARIABLES, MODEL_CACHES,
                                     ContainerPlan)

SUBMIT_DIR = '"$SLURM_SUBMIT_DIR"'
SUBMIT_MOUNT = '"$SLURM_SUBMIT_DIR:$SLURM_SUBMIT_DIR"'
SIF = '"$HPCTRAIN_SIF"'
CACHE = protocol.JOB_CACHE
# ",SRC:SRC,..." made by the setup lines; empty (or unset: a site template without them)
CACHE_MOUNTS = '"${HPCTRAIN_CACHE_MOUNTS-}"'
SKOPEO_TIMEOUT_S = 60    # an offline compute node: the registry's silence ends the question
DIGEST_BASH_RE = "^sha256:[0-9a-f]{64}$"   # what skopeo must answer (spec.container.DIGEST_RE)


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
    return listed + SUBMIT_MOUNT + CACHE_MOUNTS


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
    """Script lines before the hand-over: the image's SIF (apptainer with a registry image,
    :func:`_sif_lines`) and the caches mounted into the container (:func:`_cache_lines`)."""
    lines: list[str] = []
    if plan is not None and plan.pulls:
        lines += _sif_lines(plan)
    if plan is not None and plan.runtime != "oci":
        lines += _cache_lines(plan)
    return [ShellSafe(line) for line in lines]


def _sif_lines(plan: ContainerPlan) -> list[str]:
    """The registry image as one SIF per digest, on storage every node reads.

    A tag (``docker://...:latest``) is asked for its digest at every job start (``skopeo
    inspect``: one small request); the SIF of that digest runs, pulled as
    ``repository@digest`` when missing, and ``<sif_name>`` is pointed at it. A reference
    pinned to a digest needs no question. Where the registry cannot be asked (an offline
    compute node, no skopeo) the SIF last run for the reference runs, and the job log says
    so and why: never silently; with none there, the tag is pulled as it is. Other
    transports (``oras://``, ``library://``) cannot be asked: their SIF is kept per
    reference, and the job log says so whenever it is reused."""
    ref, tool = shq(plan.image), shq(plan.apptainer)
    where = shq(plan.sif_dir) if plan.sif_dir else '"$SLURM_SUBMIT_DIR/.hpctrain-sif"'
    tmp = '"$HPCTRAIN_SIF.$SLURM_JOB_ID.tmp.sif"'
    lines = [
        "# the image as one SIF per digest, on storage every node reads: `apptainer exec` of",
        "# a registry image would convert it again for every rank",
        f"hpctrain_sifs={where}",
        f'hpctrain_last="$hpctrain_sifs"/{shq(plan.sif_name)}   # the SIF last run for it']
    if plan.pinned_digest:
        digest = plan.pinned_digest
        lines += [f'export HPCTRAIN_SIF="$hpctrain_sifs"/{shq(plan.digest_sif(digest))}',
                  f"hpctrain_from={shq(plan.repository + '@' + digest)}"]
    elif plan.checks_digest:
        why = f'"hpctrain: cannot ask the registry which image "{ref}" is now ($hpctrain_why)'
        lines += [
            "# which image the tag names now: a moved tag (:latest) is pulled again",
            'HPCTRAIN_SIF=""',
            "if ! command -v skopeo >/dev/null 2>&1; then",
            '  hpctrain_why="skopeo is not installed here"',
            f"elif hpctrain_why=$(timeout {SKOPEO_TIMEOUT_S} skopeo inspect --no-tags "
            f"--format '{{{{.Digest}}}}' {ref} 2>&1) \\",
            "    && hpctrain_why=${hpctrain_why##*$'\\n'} && [[ $hpctrain_why =~ "
            f"{DIGEST_BASH_RE} ]]; then",
            '  export HPCTRAIN_SIF="$hpctrain_sifs/sha256-${hpctrain_why#sha256:}.sif"',
            f'  hpctrain_from={shq(plan.repository)}"@$hpctrain_why"',
            "else   # skopeo's last line says why",
            "  hpctrain_why=${hpctrain_why##*$'\\n'}; hpctrain_why=${hpctrain_why:-no answer in "
            f'{SKOPEO_TIMEOUT_S} s}}',
            "fi",
            'if [[ -z $HPCTRAIN_SIF ]]; then',
            '  export HPCTRAIN_SIF=$hpctrain_last',
            f"  hpctrain_from={ref}",
            "  if [[ -s $HPCTRAIN_SIF ]]; then",
            f'    echo {why}: running the SIF last run for it, '
            '$(readlink -- "$HPCTRAIN_SIF" || echo "$HPCTRAIN_SIF"); a moved tag is not '
            'noticed until the registry answers" >&2',
            "  else",
            f'    echo {why}: pulling the tag as it is" >&2',
            "  fi",
            "fi"]
    else:
        lines += [
            'export HPCTRAIN_SIF=$hpctrain_last',
            f"hpctrain_from={ref}",
            "if [[ -s $HPCTRAIN_SIF ]]; then",
            f'  echo "hpctrain: running the SIF pulled before for "{ref}" (only docker:// '
            'tags are asked for a newer image): remove $HPCTRAIN_SIF to pull it again" >&2',
            "fi"]
    lines += [
        'if [[ ! -s $HPCTRAIN_SIF ]]; then',
        '  echo "hpctrain: pulling $hpctrain_from into $HPCTRAIN_SIF" >&2',
        f'  mkdir -p -- "$hpctrain_sifs" && {tool} pull {tmp} "$hpctrain_from" '
        f"&& mv -f -- {tmp} {SIF} \\",
        f'    || {{ rm -f -- {tmp}; echo "hpctrain: "{tool}" pull $hpctrain_from failed" >&2; '
        "exit 1; }",
        "fi"]
    if plan.checks_digest:
        link = '"$hpctrain_last.$SLURM_JOB_ID.tmp"'
        lines += [
            "# the reference's newest SIF, for a job that cannot ask the registry",
            'if [[ $HPCTRAIN_SIF != "$hpctrain_last" ]]; then',
            f'  ln -sfn -- "${{HPCTRAIN_SIF##*/}}" {link} && mv -fT -- {link} "$hpctrain_last" \\',
            '    || echo "hpctrain: warning: could not point $hpctrain_last at $HPCTRAIN_SIF" >&2',
            "fi"]
    return lines


def _cache_lines(plan: ContainerPlan) -> list[str]:
    """The caches, mounted into the container at their own paths (``$HPCTRAIN_CACHE_MOUNTS``).

    The user's model caches are the user's, never the job's: ``HF_HOME`` and ``TORCH_HOME``
    as the job's environment sets them, else (where the runtime mounts no home) where
    Hugging Face and torch put them on the host, so a model is downloaded once per user and
    the token of ``huggingface-cli login`` (``$HF_HOME/token``, or ``HF_TOKEN_PATH``) is
    found. Where the runtime mounts no home, the scratch written under it (compiled
    kernels, pip's downloads) goes to a job-private directory that the supervisor removes
    when the job ends for good (:mod:`hpctrain.supervisor.caches`; this script, if it
    ends before the hand-over), kept across requeues. A path no mount list can hold (``,``
    or ``:`` in it) is not mounted, and the job log says so."""
    lines = ["# caches: the user's models (per user, kept), the job's scratch (per job)",
             'HPCTRAIN_CACHE_MOUNTS=""']
    if not plan.home:
        lines += ["# no home in the container: the user's model caches where the libraries "
                  "would put them"]
        lines += [f': "${{{v}:=${{XDG_CACHE_HOME:-$HOME/.cache}}/{d}}}"; export {v}'
                  for v, d in MODEL_CACHES]
        lines += [
            "# ... and the job's scratch in a job-private directory, removed when the job",
            "# ends for good (kept across requeues; the supervisor removes it at the end)",
            f'export {CACHE}="$SLURM_SUBMIT_DIR/{protocol.JOB_CACHE_DIR}/$SLURM_JOB_ID"',
            f'mkdir -p -m 700 -- "${CACHE}" || {{ echo "hpctrain: cannot create ${CACHE}" >&2; '
            "exit 1; }",
            f"trap 'rm -rf -- \"${CACHE}\"' EXIT   # ended before the hand-over: for good",
            f'HPCTRAIN_CACHE_MOUNTS=",${CACHE}:${CACHE}"']
        lines += [f': "${{{v}:=${CACHE}/{v.lower()}}}"; export {v}' for v in CACHE_VARIABLES]
    names = " ".join(f'${{{v}:+"${v}"}}' for v, _ in MODEL_CACHES)
    lines += [
        f'for hpctrain_dir in {names} ${{HF_TOKEN_PATH:+"$HF_TOKEN_PATH"}}; do',
        '  if [[ $hpctrain_dir != /* || $hpctrain_dir == *[,:]* ]]; then',
        '    echo "hpctrain: warning: $hpctrain_dir is not mounted into the container: a mount '
        'list takes only absolute paths without , or :" >&2',
        '  elif [[ $hpctrain_dir == "${HF_TOKEN_PATH:-}" ]]; then',
        '    if [[ -f $hpctrain_dir ]]; then',
        '      HPCTRAIN_CACHE_MOUNTS+=",$hpctrain_dir:$hpctrain_dir:ro"   # the token: read-only',
        '    fi',
        '  elif mkdir -p -m 700 -- "$hpctrain_dir"; then',
        '    HPCTRAIN_CACHE_MOUNTS+=",$hpctrain_dir:$hpctrain_dir"',
        "  fi",
        "done"]
    return lines


def _oci(plan: ContainerPlan) -> ContainerWords:
    return ContainerWords(srun=_join([shq("--container=" + plan.image)]))


def apptainer_env(plan: ContainerPlan | None) -> list[str]:
    """Variable names the script re-exports as ``APPTAINERENV_<NAME>="$NAME"``."""
    return list(plan.env) if plan is not None and plan.runtime == "apptainer" else []
