#!/usr/bin/env bash
# The README's demo: a 2-node job with 2 (fake) GPUs per node on the devcluster.
set -euo pipefail
out=/var/lib/hpctrain/devcluster/shared/demo
mkdir -p "$out"
job=$(sbatch --parsable --wait --nodes=2 --ntasks-per-node=2 --gres=gpu:2 \
      --output="$out/demo-%j.out" \
      --wrap='srun bash -c "echo rank \$SLURM_PROCID of \$SLURM_NTASKS on \$SLURMD_NODENAME"')
cat "$out/demo-$job.out"
sacct -j "$job" -X -o JobID,JobName,Partition,NNodes,State,Elapsed
hpctrain devcluster status
