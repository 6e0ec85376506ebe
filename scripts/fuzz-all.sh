#!/usr/bin/env bash
# scripts/fuzz-all.sh FUZZTIME: run every Go fuzz target for FUZZTIME each
# (make release). go test -fuzz takes one target of one package at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-30s}
n=0
while IFS= read -r line; do
	file=${line%%:*}
	name=$(sed 's/^func \(Fuzz[A-Za-z0-9_]*\).*/\1/' <<<"${line#*:}")
	pkg=./$(dirname "$file")
	echo "== fuzz $pkg $name ($t)"
	go test -run '^$' -fuzz "^${name}\$" -fuzztime "$t" "$pkg"
	n=$((n + 1))
done < <(grep -rn --include='*_test.go' -o '^func Fuzz[A-Za-z0-9_]*(' . | sed 's|^\./||; s/:[0-9]*:/:/')
echo "fuzzed $n targets for $t each"
