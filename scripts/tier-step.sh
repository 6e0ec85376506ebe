#!/usr/bin/env bash
# scripts/tier-step.sh RESULTS NAME CMD...: run one step of a test tier,
# append "NAME<TAB>status<TAB>seconds" to RESULTS/steps.tsv and keep its
# output in RESULTS/NAME.log. A step that exits 3 is recorded as skipped
# with the last line it printed as the reason (e.g. no release tag yet).
# Exits with the step's status; the Makefile's tiers go on to the next step
# and fail at the end, after tensorlane tier-record wrote the summary.
set -uo pipefail
results=$1 name=$2
shift 2
mkdir -p "$results"
start=$EPOCHREALTIME
"$@" 2>&1 | tee "$results/$name.log"
rc=${PIPESTATUS[0]}
secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
case $rc in
0) status=ok ;;
3) status="skipped: $(tail -n1 "$results/$name.log")" ;;
*) status="failed (rc $rc)" ;;
esac
printf '%s\t%s\t%s\n' "$name" "$status" "$secs" >>"$results/steps.tsv"
[ "$rc" -eq 3 ] && exit 0
exit "$rc"
