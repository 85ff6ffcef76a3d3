#!/bin/bash
# A plain srun job step (one task per rank), as users bring them: it has never heard of
# hpctrain. Each rank counts to TOTAL, one step per STEP_SLEEP seconds, keeping its count
# in STATE_DIR/rank-$SLURM_PROCID so a new run picks up where the last one stopped.
# No signal handling: SIGTERM or SIGUSR2 ends it. A first start (no state yet) sleeps
# STARTUP_SLEEP seconds first ("loading data"). CRASH_AT=N makes rank CRASH_RANK fail at
# step N with exit code 3. Rank 0 appends JSON events to LOG.
#   counter.sh TOTAL STATE_DIR LOG [STEP_SLEEP] [STARTUP_SLEEP] [CRASH_AT] [CRASH_RANK]
set -u
total=$1 state=$2 log=$3 step_sleep=${4:-0.5} startup=${5:-0} crash_at=${6:--1} crash_rank=${7:-1}
rank=${SLURM_PROCID:?run me under srun}
mkdir -p "$state"
file="$state/rank-$rank"
event() { (( rank == 0 )) && printf '{"event": "%s", "step": %s, "time": %s}\n' "$1" "$2" "$(date +%s.%N)" >> "$log"; return 0; }
if [[ ! -f $file ]] && [[ $startup != 0 ]]; then
    event startup 0
    sleep "$startup"
fi
n=$(cat "$file" 2>/dev/null || echo 0)
event start "$n"
while (( n < total )); do
    if (( n == crash_at && rank == crash_rank )); then
        echo "counter.sh: rank $rank: cannot read shard $n" >&2
        exit 3
    fi
    sleep "$step_sleep"
    n=$(( n + 1 ))
    # log before the count is kept: a stop between the two then logs a step twice (the
    # next run redoes it), never keeps a step it did not log
    event step "$n"
    echo "$n" > "$file.tmp" && mv -f "$file.tmp" "$file"
done
event done "$n"
