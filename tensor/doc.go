// Package tensor describes tensors and the device memory they live in.
//
// A Desc is a DLPack-compatible layout (dtype, shape, strides and offset in
// elements); a Tensor is a Desc over a Buffer of some device's Memory. Views
// made with Slice share memory. Two kinds of memory exist today:
//
//   - HostMemory: the host's DRAM, one anonymous mapping per allocation.
//   - SimMemory: a simulated accelerator, one memfd-backed arena per device
//     with the device's capacity, a first-fit allocator that returns an
//     *OutOfMemoryError (errors.Is ErrOutOfMemory) when full, and Export for
//     sharing the arena with other processes. Simulated devices copy real
//     bytes; nothing about them is a sleep.
//
// Optional capabilities are separate interfaces found by type assertion:
// HostVisible for memory the CPU can address, Exportable for memory another
// process can map. A CUDA or ROCm backend implements Memory and Buffer behind
// a build tag and callers do not change.
package tensor
