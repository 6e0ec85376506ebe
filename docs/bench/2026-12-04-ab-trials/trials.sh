#!/bin/bash
# 10 A/B trials (head with shm 10% slower) and 10 A/A trials, alternating.
B=${B:-./tensorlane}   # a build of this revision
out=${OUT:-ab-trials}; mkdir -p "$out"
for i in $(seq 1 10); do
  for kind in ab aa; do
    env=(); [ $kind = ab ] && env=(--head-env TENSORLANE_BENCH_SLOWDOWN=shm=0.10)
    s=$(date +%s)
    timeout 600 $B bench --base $B "${env[@]}" --ab-json $out/$kind-$i.json > $out/$kind-$i.txt 2>&1
    rc=$?
    echo "$kind $i rc=$rc $(( $(date +%s) - s ))s load=$(cut -d' ' -f1 /proc/loadavg) $(grep -E 'REGRESSED' $out/$kind-$i.txt | grep -v '^ab:' | awk '{print $1, $2}' | tr '\n' ' ')" >> $out/summary.txt
  done
done
