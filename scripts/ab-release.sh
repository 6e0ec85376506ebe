#!/usr/bin/env bash
# scripts/ab-release.sh TENSORLANE RESULTS: the A/B guard of the nightly
# tier, this build (head) against the last release tag (base, built from
# git). Exits 3 (a skip, to scripts/tier-step.sh) when there is no v* tag yet.
set -euo pipefail
exe=$1 results=$2
tag=$(git describe --tags --abbrev=0 --match 'v*' 2>/dev/null || true)
if [ -z "$tag" ]; then
	echo "no release tag (v*) yet to compare against"
	exit 3
fi
exec "$exe" bench --base "$tag" --head "$exe" --ab-json "$results/ab.json"
