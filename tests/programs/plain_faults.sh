#!/bin/bash
# A plain step that has never heard of hpctrain: it counts its own starts in STATE and
# behaves as the start's entry in PLAN says (comma-separated, one word per start):
#   hang   prints 3 steps, then goes silent forever (a hang only its output shows)
#   crash  prints 2 steps, then exits 3
#   ok     prints STEPS steps and exits 0
#   plain_faults.sh STATE PLAN [STEPS]
set -u
state=$1 plan=$2 steps=${3:-4}
starts=$(( $(cat "$state" 2>/dev/null || echo 0) + 1 ))
echo "$starts" > "$state"
IFS=, read -r -a words <<< "$plan"
what=${words[starts-1]:-ok}
echo "plain_faults: start $starts: $what"
for (( i = 1; i <= steps; i++ )); do
    echo "plain_faults: step $i"
    sleep 0.3
    if [[ $what == hang && $i == 3 ]]; then exec sleep 100000; fi
    if [[ $what == crash && $i == 2 ]]; then echo "plain_faults: cannot read shard $i" >&2; exit 3; fi
done
echo "plain_faults: done"
