#!/usr/bin/env bash
# gpu-check.sh: the checks of tensorlane that need a real NVIDIA GPU.
#
# 1. Go (tensor/cuda/gpucheck, build tag "gpu"): discovery, allocation (VMM
#    and legacy), Put/Get with bytes verified, device-to-device Get on one
#    GPU, cross-process p2p Get (the allocation's handle over the
#    authenticated Unix socket), device->host->tcp->host->device over
#    loopback, peer copies with two GPUs; each timed against cuMemcpy or raw
#    TCP of the same size in the same run, with the issue's goals (0.9x,
#    0.8x, 0.7x); then the device rows of `tensorlane bench --paths device`
#    (bench/devbench: d2d and cross-process Gets vs cuMemcpyDtoD, device ->
#    tcp -> device vs raw TCP), printed as BENCH lines and the bench table.
# 2. Python through the C ABI (scripts/gpu_check_device.py): torch CUDA
#    tensors between two processes on one GPU against torch's own CUDA IPC
#    (goal 0.8x), device->tcp->device on loopback against raw TCP (0.7x),
#    and the Ray transport's GPU functions (tensorlane._raycuda) called
#    directly (no Ray needed). Skipped, saying so, when python3 has no torch.
#
# Everything is built on this machine and carried to a bare GPU machine
# (the NVIDIA driver, Python with torch and numpy; no Go, no network):
#
#   scripts/gpu-check.sh                  build (if needed) and run here
#   scripts/gpu-check.sh --build [DIR]    only build (default bin/): gpucheck.test
#                                         (CGO_ENABLED=0) and libtensorlane.so (cgo);
#                                         carry DIR with the tree (about 40 MiB)
#   scripts/gpu-check.sh --run [DIR]      run what --build made (default bin/)
#   scripts/gpu-check.sh --dry-run        build, then run every step against the fake
#                                         CUDA driver (gcc builds it): the logic, not
#                                         the figures; CI runs this
#
# Environment: GPUCHECK_MIB (transfer size, default 256), GPUCHECK_ROUNDS
# (timed rounds, default 15 for Go, 10 for Python), GPUCHECK_NO_GOALS=1
# (report ratios without failing on them), GPUCHECK_PYTHON (default
# python3), TENSORLANE_LIBCUDA (driver library, default libcuda.so.1).
# Budget: on one H200 the whole check takes a few minutes (estimated, not
# yet timed on one: the bench rows add about 15 s at 256 MiB, two owner
# processes' CUDA start-up and ~17 rounds of a 256 MiB tcp Get); each step
# is bounded (Go 5 minutes, Python 3 minutes) so it ends within 8.
# Exit status: non-zero when a check or a goal failed.
set -euo pipefail
cd "$(dirname "$0")/.."

build() {
	local dir=${1:-bin}
	mkdir -p "$dir"
	CGO_ENABLED=0 go test -c -tags gpu -ldflags "-s -w" -o "$dir/gpucheck.test" ./tensor/cuda/gpucheck/
	go build -buildmode=c-shared -ldflags "-s -w" -o "$dir/libtensorlane.so" ./cmd/libtensorlane
	echo "built $dir/gpucheck.test (needs only the NVIDIA driver) and $dir/libtensorlane.so ($(du -sh "$dir" | cut -f1) in all)" >&2
}

run() {
	local dir=${1:-bin} log rc=0 py=${GPUCHECK_PYTHON:-python3}
	dir=$(cd "$dir" && pwd)
	log=$(mktemp)
	echo "== go: tensor/cuda/gpucheck"
	timeout 300 "$dir/gpucheck.test" -test.v -test.count=1 -test.timeout 290s 2>&1 | tee -a "$log" || rc=$?
	echo "== python: C ABI and tensorlane.device (scripts/gpu_check_device.py)"
	if [[ ${GPUCHECK_DRY:-} == 1 ]] || "$py" -c 'import torch, numpy; assert torch.cuda.is_available()' 2>/dev/null; then
		TENSORLANE_LIB="$dir/libtensorlane.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
			timeout 180 "$py" scripts/gpu_check_device.py 2>&1 | tee -a "$log" || rc=$?
	else
		echo "SKIP python checks: $py has no torch with CUDA (and numpy)" | tee -a "$log"
	fi
	echo
	echo "== summary"
	grep -E '^(DRIVER|DEVICE|RESULT|BENCH|SKIP|FAIL )' "$log" || true
	grep -E '^(--- FAIL|FAIL|PASS|ok)' "$log" | grep -v '^--- PASS' || true
	rm -f "$log"
	return $rc
}

dry_run() {
	local dir fake
	dir=$(mktemp -d)
	build "$dir"
	fake="$dir/libcuda.so.1"
	gcc -shared -fPIC -O1 -o "$fake" tensor/cuda/testdata/fakecuda.c
	# The fake's figures mean nothing: no goals, small sizes.
	TENSORLANE_LIBCUDA=$fake GPUCHECK_NO_GOALS=1 GPUCHECK_DRY=1 GPUCHECK_MIB=${GPUCHECK_MIB:-16} \
		GPUCHECK_ROUNDS=${GPUCHECK_ROUNDS:-3} GPUCHECK_PYTHON=${GPUCHECK_PYTHON:-python3} run "$dir"
	local rc=$?
	rm -rf "$dir"
	return $rc
}

case "${1:-}" in
--build) build "${2:-}" ;;
--run) run "${2:-bin}" ;;
--dry-run) dry_run ;;
"")
	build bin
	run bin
	;;
*) echo "usage: $0 [--build [DIR] | --run [DIR] | --dry-run]" >&2; exit 2 ;;
esac
