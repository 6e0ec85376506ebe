// Package cuda is real NVIDIA GPU memory as a tensor.Memory, through the
// CUDA driver API (libcuda.so.1) loaded at run time with purego: no cgo and
// no CUDA toolkit, so every build compiles and runs on machines without a
// GPU, where Load and NewMemory return an error matching ErrUnavailable
// that says why (the loader's message, a missing entry point, the driver's
// answer to cuInit).
//
// Allocations use the virtual memory management API (cuMemCreate,
// cuMemAddressReserve, cuMemMap, cuMemSetAccess) with one shareable POSIX
// fd per allocation (and a fabric handle where the device supports it), or
// the legacy cuMemAlloc with cuIpcGetMemHandle where VMM is missing. Buffers
// are not host visible: bytes move with tensor.Copy (device to device with
// cuMemcpyDtoDAsync or cuMemcpyPeerAsync, host to device through pinned
// staging), on streams, and every copy returns only once its event says the
// bytes are there. Export hands another process the allocation's own
// handle (tensor.Exportable); Import maps one, read-only when asked.
//
// The tests run everywhere on a fake driver (package cudatest, built with
// gcc); scripts/gpu-check.sh runs the checks that need a real GPU
// (package gpucheck). docs/cuda.md has the whole picture.
package cuda
