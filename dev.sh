#!/usr/bin/env bash
# hpctrain's one entry point on a fresh Debian machine (as root):
#   ./dev.sh demo    install everything, bring the devcluster up, run the example training job
#   ./dev.sh test    install everything, bring the devcluster up, run the whole test suite
#                    (as the ordinary user hpct-alice, which it makes) on parallel workers,
#                    each with a devcluster of its own; with test paths, just those, serially
#   ./dev.sh quick   the same set-up, then the quick tier: fast unit tests and one smoke job
#   ./dev.sh bench   run the benchmarks
#   ./dev.sh regen   regenerate the reference scripts in sbatch/
#   ./dev.sh install only install (venv in .venv, or $HPCTRAIN_VENV)
set -euo pipefail
cd "$(dirname "$0")"
VENV=${HPCTRAIN_VENV:-$PWD/.venv}
export PATH="$VENV/bin:$PATH"

# The venv's interpreter: Debian's, which every user may execute. Jobs and tests run as
# ordinary users (docs/security.md); a Python under /root (pyenv, say) is closed to them.
BASE_PYTHON=${HPCTRAIN_BASE_PYTHON:-/usr/bin/python3}

install() {
    if ! "$BASE_PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-pip
    fi
    local stamp="$VENV/.hpctrain-installed" want base
    # the version too: an editable install's metadata (hpctrain --version) is written then
    want=$( (cat setup.cfg pyproject.toml; grep __version__ hpctrain/__init__.py
             echo "$BASE_PYTHON") | sha256sum | cut -c1-16)
    if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return; fi
    base=$(readlink -f "$BASE_PYTHON")
    if [ "$(readlink -f "$VENV/bin/python" 2>/dev/null)" != "$base" ]; then
        # a venv of another interpreter (or none) is rebuilt, not patched over
        "$BASE_PYTHON" -m venv --clear "$VENV"
    fi
    # torch first, pinned: it is the CPU build on this machine; installing anything that
    # depends on torch before it would pull a multi-GB CUDA build.
    "$VENV/bin/python" -m pip install -q torch==2.13.0
    "$VENV/bin/python" -m pip install -q -e ".[dev,deepspeed,lightning,transformers]"
    echo "$want" > "$stamp"
}

bench_tools() {
    # fio: the disk's ceiling in benchmarks/ckpt_bench.py (only the benchmarks need it)
    command -v fio >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio; }
}

TEST_USER=hpct-alice

test_user() {
    # The suite runs as an ordinary user, as researchers do (docs/security.md): every
    # permission is then checked by the kernel and by Slurm, not waved through for root.
    # The operator's few steps in the tests (devcluster up, a node lost, users made) go
    # through sudo (tests/helpers/admin.py).
    command -v sudo >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sudo; }
    id -u "$TEST_USER" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$TEST_USER"
    chmod 700 "$(getent passwd "$TEST_USER" | cut -d: -f6)"
    # No password and no keys: only root can become the test user, so its sudo rule gives
    # nobody more than root already has.
    printf '%s\n' "# Written by hpctrain's dev.sh: its test user, which only root can become, acts as the devcluster's operator." \
        "$TEST_USER ALL=(ALL) NOPASSWD: ALL" > /etc/sudoers.d/hpctrain-tests
    chmod 440 /etc/sudoers.d/hpctrain-tests
    # The test user runs the project's venv: let it traverse (not list) the parents.
    local d=$PWD
    while [ "$d" != / ]; do
        if [ $(( 8#$(stat -c %a "$d") & 1 )) = 0 ]; then
            echo "dev.sh: chmod o+x $d (so that $TEST_USER reaches the project)"; chmod o+x "$d"
        fi
        d=$(dirname "$d")
    done
}

# DeepSpeed builds its CPU communication op (shm_comm) on the first init_distributed of
# each user, in ~/.cache/torch_extensions: ~85 s of CPU that would land in the middle of
# the suite. Built here for the test user, beside the devclusters coming up.
warm_deepspeed() {
    [ "$(id -u)" = 0 ] || return 0
    runuser -u "$TEST_USER" -- env -i HOME="$(getent passwd "$TEST_USER" | cut -d: -f6)" \
        PATH="$VENV/bin:/usr/bin:/bin" DS_ACCELERATOR=cpu python -c \
        'from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("ShareMemCommBuilder").load()' >/dev/null 2>&1 \
        || echo "dev.sh: could not build DeepSpeed's shm_comm op ahead (the first job will)" >&2
}

run_tests() {
    if [ "$(id -u)" != 0 ]; then python -m pytest "$@"; return; fi
    # test_user ran before cluster_up, so `up` registered it with the accounting
    # (PrivateData: slurmdbd shows its jobs only to a user it knows)
    runuser -u "$TEST_USER" -- env -i HOME="$(getent passwd "$TEST_USER" | cut -d: -f6)" \
        USER="$TEST_USER" LOGNAME="$TEST_USER" LANG=C.UTF-8 PATH="$VENV/bin:/usr/bin:/bin" \
        SLURM_CONF="$SLURM_CONF" ${CI:+CI="$CI"} ${PYTEST_ADDOPTS:+PYTEST_ADDOPTS="$PYTEST_ADDOPTS"} \
        ${HPCTRAIN_DEVCLUSTER_INSTANCE:+HPCTRAIN_DEVCLUSTER_INSTANCE="$HPCTRAIN_DEVCLUSTER_INSTANCE"} \
        ${HPCTRAIN_TEST_TIMES_OUT:+HPCTRAIN_TEST_TIMES_OUT="$HPCTRAIN_TEST_TIMES_OUT"} \
        python -m pytest -p no:cacheprovider "$@"
}

# The whole suite on $HPCTRAIN_TEST_WORKERS parallel workers (default 3), worker gwN on
# devcluster instance N (tests/cluster/conftest.py): the cluster tests mostly wait (job
# start, requeue holds, grace times), so their waits overlap. Whole files go to one worker
# (--dist loadfile: a file's jobs shared between its cases stay together). Then the few
# tests marked `alone` (they change what all instances share), one at a time.
# 3 on 2 cores: with 4 the CPU was idle 4% of a full run instead of 9-12% and the suite
# took 9% less time, but the heavier load showed a spare's recovery failing once (the
# lost node not found before Slurm's NODE_FAIL; 2026-11-28): not until that is understood.
WORKERS=${HPCTRAIN_TEST_WORKERS:-3}

run_suite() {
    local arg
    for arg in "$@"; do
        # tests named on the command line: run just those, serially, on instance 0
        if [ -e "${arg%%::*}" ]; then run_tests "$@"; return; fi
    done
    if [ "$WORKERS" -le 1 ]; then run_tests "$@"; return; fi
    local i rc status=0 warm
    warm_deepspeed & warm=$!
    for ((i = 1; i < WORKERS; i++)); do hpctrain devcluster up --instance "$i"; done
    # the strict site's devcluster (tests/cluster/conftest.py: STRICT_INSTANCE), up before
    # the workers start: bringing an instance up rewrites /etc/hosts, which they all read
    hpctrain devcluster up --instance 7 --site strict
    wait "$warm"
    # the longest files first (tests/conftest.py orders them), not xdist's largest count
    run_tests -n "$WORKERS" --dist loadfile --no-loadscope-reorder -m "not alone" "$@" \
        || status=$?
    # the first failure's code is the suite's
    run_tests -m alone "$@" || { rc=$?; [ "$status" != 0 ] || status=$rc; }
    return "$status"
}

cluster_up() {
    hpctrain devcluster up
    export SLURM_CONF=/var/lib/hpctrain/devcluster/etc/slurm.conf
    # tests named on the command line may run on another instance (work beside a running
    # suite): HPCTRAIN_DEVCLUSTER_INSTANCE=N ./dev.sh test tests/cluster/test_x.py
    if [ -n "${HPCTRAIN_DEVCLUSTER_INSTANCE:-}" ] && [ "$HPCTRAIN_DEVCLUSTER_INSTANCE" != 0 ]; then
        hpctrain devcluster up --instance "$HPCTRAIN_DEVCLUSTER_INSTANCE"
    fi
}

case "${1:-}" in
    install) install ;;
    demo)    install; cluster_up; exec bash examples/demo.sh ;;
    test)    install; [ "$(id -u)" != 0 ] || test_user; cluster_up; shift; run_suite "$@" ;;
    # the quick tier for every change: the fast unit tests and one job on the devcluster
    quick)   install; [ "$(id -u)" != 0 ] || test_user; cluster_up; shift
             run_tests -m "smoke or not (slow or slurm)" "$@" ;;
    bench)   install; bench_tools; cluster_up; shift; exec bash benchmarks/run_all.sh "$@" ;;
    regen)   install; exec python tools/regen_sbatch.py ;;
    *) echo "usage: ./dev.sh demo|test|quick|bench|regen|install" >&2; exit 2 ;;
esac
