"""Recorded-behaviour STAND-INS for srun (with pyxis's container options), scontrol, scancel,
sacct, apptainer, skopeo and lfs, to run rendered scripts in bash.

Real Slurm runs in the slurm-marked tests; these exist so a rendered script can be
*executed* in a plain unit test (is a hostile value ever run? does a signal during setup
reach the supervisor?) without a cluster, and so the Lustre branch (no Lustre here) can
be exercised, and the container runtimes that cannot be installed here (pyxis/enroot,
Apptainer) have their argument handling checked.
Each stand-in only records its arguments and answers as the real tool did on the
devcluster; none of them pretends to schedule anything.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

STANDINS = {
    "srun": r'''#!/bin/bash
# STAND-IN for srun: records its argv; then, by $STANDIN_SRUN_MODE, runs the command
# part (after srun's own --options) as the one task "exec", or stands in for a long
# training step "sleep" (record only, then sleep).
printf '%s\0' "$@" > "$STANDIN_LOG/srun.argv"
echo $$ > "$STANDIN_LOG/srun.pid"
# pyxis's options, as the SPANK plugin parses them (pyxis wiki "Usage", 0.11+): mounts are
# SRC:DST[:FLAGS] separated by ",", flags by "+", and a target must start with / or .;
# what it understood goes to pyxis.args, one "key value..." line each
for arg in "$@"; do
  case "$arg" in
    --container-image=*) echo "image ${arg#*=}" >> "$STANDIN_LOG/pyxis.args" ;;
    --container-workdir=*) echo "workdir ${arg#*=}" >> "$STANDIN_LOG/pyxis.args" ;;
    --container-env=*) echo "env ${arg#*=}" >> "$STANDIN_LOG/pyxis.args" ;;
    --container-name=*) echo "name ${arg#*=}" >> "$STANDIN_LOG/pyxis.args" ;;
    --container-writable|--container-readonly|--no-container-mount-home)
      echo "flag ${arg#--}" >> "$STANDIN_LOG/pyxis.args" ;;
    --container-mounts=*)
      IFS=, read -ra specs <<< "${arg#*=}"
      for spec in "${specs[@]}"; do
        IFS=: read -r src dst flags extra <<< "$spec"
        if [[ -z $src || -z $dst || -n $extra || ! $dst =~ ^[/.] ]]; then
          echo "pyxis: invalid mount: $spec" >&2; exit 1
        fi
        echo "mount $src $dst ${flags:-rw}" >> "$STANDIN_LOG/pyxis.args"
      done ;;
    --container-*) echo "srun: unrecognized option '$arg'" >&2; exit 1 ;;
  esac
done
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1 SLURM_NODEID=0 SLURM_NNODES=1
case "${STANDIN_SRUN_MODE:-exec}" in
  exec) exec "$@" ;;
  sleep) exec sleep 30 ;;
  record) exit 0 ;;
esac
''',
    "scontrol": r'''#!/bin/bash
# STAND-IN for scontrol: `show hostnames` answers what the devcluster answered for
# n[1-2]; `show job -o ID` answers the devcluster's one-line record of a running job (as
# recorded there, with times of now: it started a minute ago and ends in
# $STANDIN_END_IN_S seconds, 600 by default, or at $STANDIN_END_AT (epoch s); PreemptTime
# is a date once Slurm picked the job for preemption: $STANDIN_PREEMPT_TIME, else None);
# every call is recorded.
printf '%s\n' "$*" >> "$STANDIN_LOG/scontrol.calls"
if [[ $1 == show && $2 == hostnames ]]; then printf 'n1\nn2\n'; fi
if [[ $1 == show && $2 == job ]]; then
  printf 'JobId=%s JobName=x UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) ' "${@: -1}"
  printf 'Requeue=1 Restarts=%s BatchFlag=1 ExitCode=0:0 TimeLimit=00:10:00 ' "${SLURM_RESTART_COUNT:-0}"
  start=$(date -d '-60 sec' +%Y-%m-%dT%H:%M:%S)
  when="+${STANDIN_END_IN_S:-600} sec"
  [[ -n ${STANDIN_END_AT:-} ]] && when="@$STANDIN_END_AT"
  end=$(date -d "$when" +%Y-%m-%dT%H:%M:%S)
  printf 'StartTime=%s EndTime=%s ' "$start" "$end"
  printf 'PreemptEligibleTime=%s PreemptTime=%s SuspendTime=None ' "$start" "${STANDIN_PREEMPT_TIME:-None}"
  printf 'Partition=debug NodeList=n[1-2] BatchHost=n1 StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null\n'
fi
''',
    "scancel": r'''#!/bin/bash
# STAND-IN for scancel: records the call; `--signal=SIG JOBID` delivers SIG to the job's
# step (here: the srun stand-in's process), as the real one delivers it to the tasks.
printf '%s\n' "$*" >> "$STANDIN_LOG/scancel.calls"
# Only while that process is ours (its environment has our STANDIN_LOG): a pid file
# outlives its process, and on a busy machine the pid is soon somebody else's (a real
# job's rank on the devcluster, say).
if [[ $1 == --signal=* && -f $STANDIN_LOG/srun.pid ]]; then
  pid=$(cat "$STANDIN_LOG/srun.pid")
  if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qxF "STANDIN_LOG=$STANDIN_LOG"; then
    kill -s "${1#--signal=}" "$pid"
  fi
fi
''',
    "sinfo": r'''#!/bin/bash
# STAND-IN for sinfo: records the call; `-h -N -n NODES -o %N|%T` answers each node of the
# comma-separated NODES as the devcluster's sinfo printed an allocated one ("n1|allocated").
printf '%s\n' "$*" >> "$STANDIN_LOG/sinfo.calls"
while [[ $# -gt 0 ]]; do
  if [[ $1 == -n ]]; then IFS=, read -ra nodes <<< "$2"; printf '%s|allocated\n' "${nodes[@]}"; fi
  shift
done
''',
    "sacct": r'''#!/bin/bash
# STAND-IN for sacct: records the call; answers `-o State` with $STANDIN_SACCT_STATES
# (one run per line, oldest first, as `sacct -n -X -D -P` printed them on the devcluster).
printf '%s\n' "$*" >> "$STANDIN_LOG/sacct.calls"
printf '%b' "${STANDIN_SACCT_STATES:-}"
''',
    "apptainer": r'''#!/bin/bash
# STAND-IN for `apptainer exec` (apptainer-exec(1)): [--nv|--nvccli] [-B|--bind SPEC]...
# [--pwd DIR] [--writable-tmpfs] IMAGE COMMAND...; a bind SPEC is src[:dest[:opts]],
# comma-separated, opts ro or rw. Records what it understood in apptainer.args, then runs
# the command in DIR on the host (it cannot bind anything), the way the container would
# see it. `apptainer pull DEST SOURCE` (apptainer-pull(1)) records the pull and writes DEST
# (refusing, as apptainer does, a DEST that exists).
if [[ $1 == pull ]]; then
  [[ -e $2 ]] && { echo "FATAL: Image file already exists: \"$2\"" >&2; exit 255; }
  echo "pull $3" >> "$STANDIN_LOG/apptainer.args"
  echo "SIF of $3" > "$2"; exit 0
fi
[[ $1 == exec ]] || { echo "apptainer stand-in: only exec and pull" >&2; exit 1; }
shift
pwd_dir=""
while [[ $# -gt 0 && $1 == -* ]]; do
  case "$1" in
    -B|--bind) IFS=, read -ra specs <<< "$2"
      for spec in "${specs[@]}"; do
        IFS=: read -r src dst opts extra <<< "$spec"
        if [[ -z $src || -n $extra || ! ${opts:-rw} =~ ^(ro|rw)$ ]]; then
          echo "FATAL: invalid bind path specification: $spec" >&2; exit 255
        fi
        echo "bind $src ${dst:-$src} ${opts:-rw}" >> "$STANDIN_LOG/apptainer.args"
      done; shift 2 ;;
    --pwd) pwd_dir=$2; echo "pwd $2" >> "$STANDIN_LOG/apptainer.args"; shift 2 ;;
    --writable-tmpfs|--nv|--nvccli) echo "flag ${1#--}" >> "$STANDIN_LOG/apptainer.args"; shift ;;
    *) echo "Error: unknown flag: $1" >&2; exit 255 ;;
  esac
done
echo "image $1" >> "$STANDIN_LOG/apptainer.args"
shift
env | grep '^APPTAINERENV_' | sort >> "$STANDIN_LOG/apptainer.env"
[[ -n $pwd_dir ]] && cd "$pwd_dir"
exec "$@"
''',
    "skopeo": r'''#!/bin/bash
# STAND-IN for `skopeo inspect` (skopeo-inspect(1)): `inspect --no-tags --format
# '{{.Digest}}' docker://REF` prints the digest of the manifest the tag names now and exits
# 0. The registry is $STANDIN_REGISTRY_DIGEST (a test moves the tag by changing it); when
# it is unset the registry cannot be reached, and the stand-in answers as skopeo 1.9.3
# answered on a machine without a network (recorded): one fatal line on stderr, exit 1.
printf '%s\n' "$*" >> "$STANDIN_LOG/skopeo.calls"
[[ $1 == inspect ]] || { echo "skopeo stand-in: only inspect" >&2; exit 1; }
ref=${@: -1}
if [[ -z ${STANDIN_REGISTRY_DIGEST:-} ]]; then
  path=${ref#docker://}; host=${path%%/*}   # docker's rule: a first part with . or : is a host
  [[ $path == */* && ($host == *.* || $host == *:* || $host == localhost) ]] \
    || host=registry-1.docker.io
  why="pinging container registry $host: Get \\\"https://$host/v2/\\\": dial tcp: lookup $host"
  printf 'time="%s" level=fatal msg="Error parsing image name \\"%s\\": %s on %s"\n' \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$ref" "$why" "10.255.255.53:53: no such host" >&2
  exit 1
fi
echo "$STANDIN_REGISTRY_DIGEST"
''',
    "argv-recorder": r'''#!/bin/bash
# STAND-IN for the training program: records its argv and environment, NUL-separated.
printf '%s\0' "$@" > "$STANDIN_LOG/command.argv"
env -0 > "$STANDIN_LOG/command.env"
''',
}
LFS = r'''#!/bin/bash
# STAND-IN for Lustre's lfs (no Lustre here): records the call, succeeds.
printf '%s\n' "$*" >> "$STANDIN_LOG/lfs.calls"
'''


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    log: Path

    def read(self, name: str) -> str:
        p = self.log / name
        return p.read_bytes().decode() if p.exists() else ""  # keep \r as is

    def nul_list(self, name: str) -> list[str]:
        return self.read(name).split("\0")[:-1]


def make_standins(root: Path, lfs: bool = False) -> Path:
    bin_dir = root / "standin-bin"
    bin_dir.mkdir(exist_ok=True)
    files = dict(STANDINS, **({"lfs": LFS} if lfs else {}))
    for name, text in files.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def script_env(root: Path, lfs: bool = False, **extra: str) -> dict[str, str]:
    log = root / "standin-log"
    log.mkdir(exist_ok=True)
    return {"PATH": f"{make_standins(root, lfs)}:/usr/bin:/bin", "STANDIN_LOG": str(log),
            "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[1-2]", "HOME": str(root),
            "SLURM_SUBMIT_DIR": str(root), **extra}


def run_script(script: str, root: Path, lfs: bool = False, timeout: float = 30,
               **extra: str) -> Run:
    """Execute a rendered script with bash, stand-ins first on PATH, cwd ``root``."""
    path = root / "job.sbatch"
    path.write_text(script)
    env = script_env(root, lfs, **extra)
    proc = subprocess.run(["/bin/bash", str(path)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr, Path(env["STANDIN_LOG"]))


def start_script(script: str, root: Path, **extra: str) -> tuple[subprocess.Popen, Path]:
    """Start a rendered script in its own process group; returns (process, log dir)."""
    path = root / "job.sbatch"
    path.write_text(script)
    env = script_env(root, **extra)
    proc = subprocess.Popen(["/bin/bash", str(path)], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    return proc, Path(env["STANDIN_LOG"])


def kill_group(proc: subprocess.Popen) -> None:
    """Clean up what start_script started (its own session only)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
