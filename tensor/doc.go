// Package tensor describes tensors and the device memory they live in.
//
// A Desc is a DLPack-compatible layout (dtype, shape, strides and offset in
// elements); a Tensor is a Desc over a Buffer of some device's Memory. Views
// made with Slice share memory. Two kinds of memory exist today:
//
//   - HostMemory: the host's DRAM, one memfd mapping per allocation.
//   - SimMemory: a simulated accelerator: a device address space of the
//     device's capacity handed out first-fit (an *OutOfMemoryError, errors.Is
//     ErrOutOfMemory, when full), each allocation backed by a memfd of its
//     own. Simulated devices copy real bytes; nothing about them is a sleep.
//
// Both share one allocation at a time with other processes (Exportable, see
// share.go), as CUDA's VMM exports one allocation per shareable handle: a
// ReadOnly handle cannot write, a Writable one reaches only its slot, and
// exported memory is never recycled into another allocation.
//
// Optional capabilities are separate interfaces found by type assertion:
// HostVisible for memory the CPU can address, Exportable for memory another
// process can map, Summed for a buffer whose bytes are final and whose
// block checksums (ChunkSums) are computed once. Real device memory (tensor/cuda: NVIDIA GPUs through the
// CUDA driver API, loaded at run time without cgo; tensor/hip: AMD GPUs
// through HIP, on the same engine) implements Memory and Buffer too; its
// buffers are not HostVisible but DeviceCopier and PeerCopier, and Copy
// moves bytes between any two buffers, whatever memory they live in.
// tensor/backend is the registry that gives a topology's devices their
// memory (simulated, CUDA, HIP, or a registered back-end); MemStats.Backend
// says which a memory is.
package tensor
