#!/usr/bin/env bash
# hpctrain's one entry point on a fresh Debian machine (as root):
#   ./dev.sh demo    install everything, bring the devcluster up, run the example training job
#   ./dev.sh test    install everything, bring the devcluster up, run the whole test suite
#   ./dev.sh bench   run the benchmarks
#   ./dev.sh regen   regenerate the reference scripts in sbatch/
#   ./dev.sh install only install (venv in .venv, or $HPCTRAIN_VENV)
set -euo pipefail
cd "$(dirname "$0")"
VENV=${HPCTRAIN_VENV:-$PWD/.venv}
export PATH="$VENV/bin:$PATH"

install() {
    if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-pip
    fi
    local stamp="$VENV/.hpctrain-installed" want
    want=$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
    if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return; fi
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    # torch first, pinned: it is the CPU build on this machine; installing anything that
    # depends on torch before it would pull a multi-GB CUDA build.
    "$VENV/bin/python" -m pip install -q torch==2.13.0
    "$VENV/bin/python" -m pip install -q -e ".[dev,deepspeed]"
    echo "$want" > "$stamp"
}

bench_tools() {
    # fio: the disk's ceiling in benchmarks/ckpt_bench.py (only the benchmarks need it)
    command -v fio >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio; }
}

cluster_up() {
    hpctrain devcluster up
    export SLURM_CONF=/var/lib/hpctrain/devcluster/etc/slurm.conf
}

case "${1:-}" in
    install) install ;;
    demo)    install; cluster_up; exec bash examples/demo.sh ;;
    test)    install; cluster_up; shift; exec python -m pytest "$@" ;;
    bench)   install; bench_tools; cluster_up; shift; exec bash benchmarks/run_all.sh "$@" ;;
    regen)   install; exec python tools/regen_sbatch.py ;;
    *) echo "usage: ./dev.sh demo|test|bench|regen|install" >&2; exit 2 ;;
esac
