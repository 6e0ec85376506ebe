#!/usr/bin/env bash
# gpu-check.sh: the checks of tensor/cuda that need a real NVIDIA GPU
# (tensor/cuda/gpucheck, build tag "gpu"): discovery, allocation (VMM and
# legacy), Put/Get with bytes verified, device-to-device Get on one GPU,
# cross-process p2p Get (the allocation's handle over the authenticated
# Unix socket), device->host->tcp->host->device over loopback, peer copies
# with two GPUs; each timed against cuMemcpy or raw TCP of the same size in
# the same run, with the issue's goals (0.9x, 0.8x, 0.7x).
#
# The test binary is built without cgo, so it can be built on any machine
# and carried to a bare GPU machine that has only the NVIDIA driver:
#
#   scripts/gpu-check.sh                  build (if needed) and run here
#   scripts/gpu-check.sh --build [OUT]    only build the binary (default bin/gpucheck.test)
#   scripts/gpu-check.sh --run BIN        run a binary built elsewhere
#
# Environment: GPUCHECK_MIB (transfer size, default 256), GPUCHECK_ROUNDS
# (timed rounds, default 15), GPUCHECK_NO_GOALS=1 (report ratios without
# failing on them), TENSORLANE_LIBCUDA (driver library, default
# libcuda.so.1; point it at the fake driver of tensor/cuda/cudatest to
# dry-run the logic on a machine without a GPU; its figures mean nothing).
# Exit status: non-zero when a check or a goal failed.
set -euo pipefail
cd "$(dirname "$0")/.."

build() {
	local out=${1:-bin/gpucheck.test}
	mkdir -p "$(dirname "$out")"
	CGO_ENABLED=0 go test -c -tags gpu -o "$out" ./tensor/cuda/gpucheck/
	echo "built $out (CGO_ENABLED=0: needs only the NVIDIA driver at run time)" >&2
}

run() {
	local bin=$1 log
	log=$(mktemp)
	local rc=0
	"$bin" -test.v -test.count=1 -test.timeout 20m 2>&1 | tee "$log" || rc=$?
	echo
	echo "== summary"
	grep -E '^(DRIVER|DEVICE|RESULT)' "$log" || true
	grep -E '^(--- FAIL|FAIL|PASS|ok)' "$log" | grep -v '^--- PASS' || true
	rm -f "$log"
	return $rc
}

case "${1:-}" in
--build) build "${2:-}" ;;
--run) run "${2:?usage: gpu-check.sh --run BIN}" ;;
"")
	build bin/gpucheck.test
	run bin/gpucheck.test
	;;
*) echo "usage: $0 [--build [OUT] | --run BIN]" >&2; exit 2 ;;
esac
