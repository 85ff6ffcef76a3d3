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
SKOPEO_KILL_S = 5        # ... and a skopeo that ignores the TERM is killed this much later
OWN_SIFS = '"$SLURM_SUBMIT_DIR/.hpctrain-sif"'   # the user's own SIFs (the default sif_dir)
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
    reference, and the job log says so whenever it is reused. Each pull writes a temporary
    file of the job's id (removed first: a requeued job keeps its id, and its earlier run
    may have been killed in the pull) and renames it; a site's shared ``sif_dir`` gets SIFs
    every user reads (:func:`_shared_sif_lines`)."""
    ref, tool = shq(plan.image), shq(plan.apptainer)
    where = shq(plan.sif_dir) if plan.sif_dir else OWN_SIFS
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
            f"elif hpctrain_why=$(timeout -k {SKOPEO_KILL_S} {SKOPEO_TIMEOUT_S} skopeo inspect "
            "--no-tags "
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
            "  if [[ -s $HPCTRAIN_SIF && -r $HPCTRAIN_SIF ]]; then",
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
            "if [[ -s $HPCTRAIN_SIF && -r $HPCTRAIN_SIF ]]; then",
            f'  echo "hpctrain: running the SIF pulled before for "{ref}" (only docker:// '
            'tags are asked for a newer image): remove $HPCTRAIN_SIF to pull it again" >&2',
            "fi"]
    if plan.sif_dir:
        lines += _shared_sif_lines()
    # a requeued job keeps its id: a temporary SIF its earlier run left (killed in the
    # pull) is removed first, as `apptainer pull` refuses a file that exists
    pull = [f'mkdir -p -- "$hpctrain_sifs" && rm -f -- {tmp} && {tool} pull {tmp} '
            '"$hpctrain_from" \\']
    if plan.sif_dir:   # the site's shared directory: a SIF every user reads
        pull = ["( if (( hpctrain_shared )); then umask 022; fi",
                f"  {pull[0]}",
                f"    && {{ (( ! hpctrain_shared )) || chmod a+r -- {tmp}; }} "
                f"&& mv -f -- {tmp} {SIF} ) \\"]
    else:
        pull.append(f"    && mv -f -- {tmp} {SIF} \\")
    lines += [
        'if [[ ! -s $HPCTRAIN_SIF || ! -r $HPCTRAIN_SIF ]]; then',
        '  echo "hpctrain: pulling $hpctrain_from into $HPCTRAIN_SIF" >&2',
        *("  " + line for line in pull),
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


def _shared_sif_lines() -> list[str]:
    """The site's ``sif_dir`` is shared by every user of the partition: its SIFs are pulled
    world-readable (umask 022, ``chmod a+r``), so the next user's job runs them. Where it
    cannot serve this user (a SIF there this user cannot read, an earlier hpctrain's 0600
    one say, or a directory this user cannot write a missing SIF into) the job uses the
    user's own ``<submit dir>/.hpctrain-sif`` instead, pulled with the job's umask, and
    the job log says why."""
    own = OWN_SIFS
    return [
        "# the site's sif_dir is shared: SIFs pulled there are every user's (world-readable);",
        "# where it cannot serve this user, the user's own directory does, and the log says why",
        "hpctrain_shared=1",
        'hpctrain_cannot=""',
        "if [[ -e $HPCTRAIN_SIF && ! -r $HPCTRAIN_SIF ]]; then",
        '  hpctrain_cannot="$HPCTRAIN_SIF is there but $(id -un) cannot read it ($(stat -L -c '
        "'owner %U, mode %a' -- \"$HPCTRAIN_SIF\" 2>/dev/null)): its owner can chmod a+r it\"",
        'elif [[ ! -e $HPCTRAIN_SIF && -d $hpctrain_sifs && ! ( -w $hpctrain_sifs && -x '
        "$hpctrain_sifs ) ]]; then",
        '  hpctrain_cannot="$(id -un) cannot write $hpctrain_sifs (owner $(stat -c %U -- '
        '"$hpctrain_sifs" 2>/dev/null)): the site makes it writable by the users who share it '
        '(a group directory, chmod 2775)"',
        "fi",
        "if [[ -n $hpctrain_cannot ]]; then",
        f"  hpctrain_sifs={own}; hpctrain_shared=0",
        '  hpctrain_last="$hpctrain_sifs/${hpctrain_last##*/}"',
        '  export HPCTRAIN_SIF="$hpctrain_sifs/${HPCTRAIN_SIF##*/}"',
        '  echo "hpctrain: warning: the site\'s sif_dir cannot serve this job: $hpctrain_cannot;'
        ' using this user\'s own $HPCTRAIN_SIF instead" >&2',
        "fi"]


def _cache_lines(plan: ContainerPlan) -> list[str]:
    """The caches, mounted into the container at their own paths (``$HPCTRAIN_CACHE_MOUNTS``).

    The user's model caches are the user's, never the job's: ``HF_HOME`` and ``TORCH_HOME``
    as the job's environment sets them, else (where the runtime mounts no home) where
    Hugging Face and torch put them on the host, so a model is downloaded once per user and
    the token of ``huggingface-cli login`` (``$HF_HOME/token``, or ``HF_TOKEN_PATH``) is
    found. Where the runtime mounts no home, the scratch written under it (compiled
    kernels, pip's downloads) goes to a job-private directory that the supervisor removes
    when the job ends for good (:mod:`hpctrain.supervisor.caches`; this script, if it
    ends before the hand-over), kept across requeues. A path no mount list can hold (``,``,
    ``:`` or whitespace in it) is not mounted, and the job log says so; so is a model cache
    with no default (neither HOME nor XDG_CACHE_HOME set)."""
    lines = ["# caches: the user's models (per user, kept), the job's scratch (per job)",
             'HPCTRAIN_CACHE_MOUNTS=""']
    if not plan.home:
        lines += ["# no home in the container: the user's model caches where the libraries "
                  "would put them"]
        # HOME may be unset too (set -u): then there is no default, and the log says so
        lines += ['hpctrain_user_cache=${XDG_CACHE_HOME:-${HOME:+$HOME/.cache}}']
        lines += [f'if [[ -n ${{{v}:-}} ]]; then export {v}; '
                  'elif [[ -n $hpctrain_user_cache ]]; then '
                  f'export {v}="$hpctrain_user_cache/{d}"; '
                  f'else echo "hpctrain: warning: {v} is not mounted into the container: it is '
                  f'unset and so are HOME and XDG_CACHE_HOME (set {v} to keep these caches '
                  'across jobs)" >&2; fi'
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
        "  if [[ $hpctrain_dir != /* || $hpctrain_dir == *[,:[:space:]]* ]]; then",
        '    echo "hpctrain: warning: $hpctrain_dir is not mounted into the container: a mount '
        'list takes only absolute paths without , : or whitespace" >&2',
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
