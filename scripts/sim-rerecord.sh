#!/usr/bin/env bash
# Re-records the shaped broadcast runs that fabricsim is checked against
# (internal/multihost's TestSimVsRecorded, issue 28): the six record files
# under docs/bench/2026-12-03-broadcast*/, each run again with the settings
# it was taken with (docs/benchmarks.md), written over the old one with its
# plot. Every record now keeps the load average it was taken at; the
# comparison calls a case taken at a load of at least twice the cores
# (TENSORLANE_SIM_LOADED overrides) loaded, and a loaded case slower than
# simulated "not reproducible". So run it on a quiet machine: it prints the
# load before each file and at the end, then the comparison.
#
#   sudo scripts/sim-rerecord.sh            # all six, ~15 min, root (namespaces)
#   sudo scripts/sim-rerecord.sh 64KiB      # only the files whose name has 64KiB
#
# Nothing is committed; check `git diff --stat docs/bench` and the table.
# SIM_RERECORD_DEST=dir writes the files under dir instead of docs/bench
# (and skips the comparison, which reads docs/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
only=${1:-}
dest=${SIM_RERECORD_DEST:-docs/bench}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# file (relative to docs/bench), then the environment TestBroadcastShaped
# took it with.
cases=(
  "2026-12-03-broadcast/broadcast-shaped|"
  "2026-12-03-broadcast/broadcast-shaped-1024MiB|TENSORLANE_BCAST_SIZE=1024 TENSORLANE_BCAST_READERS=1,2,4,8"
  "2026-12-03-broadcast/broadcast-shaped-1024MiB-16|TENSORLANE_BCAST_SIZE=1024 TENSORLANE_BCAST_READERS=1,16"
  "2026-12-03-broadcast-window/broadcast-shaped-64KiB-chunks-windows|TENSORLANE_BCAST_CHUNK=64 TENSORLANE_BCAST_SIZE=64 TENSORLANE_BCAST_READERS=1,8 TENSORLANE_BCAST_WINDOWS=1,4,8"
  "2026-12-03-broadcast-window/broadcast-shaped-256MiB-windows|TENSORLANE_BCAST_SIZE=256 TENSORLANE_BCAST_READERS=1,8 TENSORLANE_BCAST_WINDOWS=1,4"
  "2026-12-03-broadcast-window/broadcast-shaped-1024MiB-windows|TENSORLANE_BCAST_SIZE=1024 TENSORLANE_BCAST_READERS=1,8 TENSORLANE_BCAST_WINDOWS=1,4"
)
for c in "${cases[@]}"; do
  file=${c%%|*}
  envs=${c#*|}
  [[ -n $only && $file != *"$only"* ]] && continue
  echo "== $file: load $(cut -d' ' -f1-3 /proc/loadavg)"
  out="$tmp/$(basename "$file")"
  mkdir -p "$out"
  # shellcheck disable=SC2086 # envs is a list of VAR=value words
  env TENSORLANE_BCAST_SHAPED=1 TENSORLANE_BCAST_OUT="$out" $envs \
    go test -count=1 -timeout 30m -run 'TestBroadcastShaped$' ./internal/multihost/ >"$out/log" 2>&1 ||
    { tail -40 "$out/log"; echo "sim-rerecord: $file failed (log above)" >&2; exit 1; }
  # The test names its file by size, chunk and windows only; the record
  # keeps the name the comparison knows it by.
  json=$(ls "$out"/*.json)
  mkdir -p "$(dirname "$dest/$file")"
  cp "$json" "$dest/$file.json"
  cp "${json%.json}.png" "$dest/$file.png"
done
echo "== done: load $(cut -d' ' -f1-3 /proc/loadavg)"
[[ $dest == docs/bench ]] || exit 0
go test -count=1 -run 'TestSimVsRecorded$' -v ./internal/multihost/ | grep -v '^=== '
