// Package gpucheck holds the checks of tensor/cuda that need a real NVIDIA
// GPU. They are tests behind the "gpu" build tag, run by
// scripts/gpu-check.sh (a test binary built with CGO_ENABLED=0, so it can
// be built here and carried to a bare GPU machine):
//
//   - discovery: the driver's devices and their real memory sizes;
//   - allocation (VMM and legacy), Put/Get through pinned staging, bytes
//     verified; out of memory as a typed error;
//   - device-to-device Get on one GPU through the p2p transport
//     (fabric/local), against cuMemcpy of the same size in the same run
//     (goal ≥ 0.9×);
//   - cross-process p2p Get: an owner process exports its allocation's
//     handle over the authenticated Unix socket (fabric/shm), this process
//     imports it and the GPU copies (goal ≥ 0.8× cuMemcpy);
//   - device→host→tcp→host→device over loopback (fabric/tcp with pinned
//     staging on both ends) against raw loopback TCP (goal ≥ 0.7×);
//   - peer copies when the machine has two GPUs.
//
// Without the tag the package is empty. With the tag and no GPU the tests
// fail, saying why CUDA is unavailable (set TENSORLANE_LIBCUDA to the fake
// driver of tensor/cuda/cudatest to dry-run the logic on any machine; its
// figures mean nothing).
package gpucheck
