#!/usr/bin/env bash
# Every benchmark, one after another. Figures are ratios against a baseline measured in
# the same run (the machine is shared and noisy). Extra arguments go to ckpt_bench.py,
# e.g. `./dev.sh bench --size 256M` for a quicker checkpoint run.
set -euo pipefail
cd "$(dirname "$0")/.."
for bench in benchmarks/cli_bench.py benchmarks/plan_bench.py benchmarks/requeue_bench.py \
             benchmarks/hang_bench.py benchmarks/inprocess_bench.py benchmarks/elastic_bench.py \
             benchmarks/remote_bench.py benchmarks/progress_bench.py benchmarks/index_bench.py \
             benchmarks/status_lag_bench.py benchmarks/peer_bench.py \
             benchmarks/ckpt_scale_sim.py benchmarks/sweep_bench.py benchmarks/rehearsal.py; do
    [ -f "$bench" ] || continue
    echo "== $bench"
    python "$bench"
done
echo "== benchmarks/ckpt_bench.py"
python benchmarks/ckpt_bench.py "$@"
