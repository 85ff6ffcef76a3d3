#!/usr/bin/env bash
# The README's demo: the tiny GPT example (examples/gpt.toml: 2 nodes x 2 GPUs, tp=2 x dp=2)
# submitted to the devcluster with `hpctrain submit --wait`, in a fresh run directory on
# the shared storage. Expects `hpctrain` on PATH and the devcluster up (./dev.sh demo).
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=$(date +%Y%m%d-%H%M%S)
run=/var/lib/hpctrain/devcluster/shared/demo-$(id -un)/run-$stamp
mkdir -p "$run"
script=$PWD/examples/train_gpt.py
# the job named after its run, so that the report below finds this job and no other
name=gpt-demo-$stamp
hpctrain submit examples/gpt.toml --dry-run --set name="$name" --set workdir="$run" | head -n 12
hpctrain submit examples/gpt.toml --wait \
    --set name="$name" \
    --set workdir="$run" \
    --set checkpoint.dir="$run/ckpt" \
    --set "run.command=[\"python\", \"$script\", \"--steps\", \"200\", \"--log-file\", \"$run/steps.jsonl\"]"
echo
echo "last training steps ($run/steps.jsonl):"
tail -n 3 "$run/steps.jsonl"
hpctrain ckpt list "$run/ckpt"
hpctrain status
# where its GPU-time went, and its throughput and MFU (CPU figures here: the GPUs are emulated)
# (this job by its name, not the newest job: another submission, a notebook's, may have
# come since)
job=$(hpctrain status --limit 200 --json | NAME=$name python3 -c \
    'import json, os, sys; print(next(j["job_id"] for j in json.load(sys.stdin)["jobs"] if j["name"] == os.environ["NAME"]))')
hpctrain report "$job" --html "$run/report.html"
hpctrain devcluster status
