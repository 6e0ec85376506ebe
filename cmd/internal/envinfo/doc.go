// Package envinfo is the engine of `tensorlane env`: the manifest a bug
// report or a reproducible environment needs (kernel, distribution, Go,
// tensorlane's own version, CPU, accelerators, the versions of the NVIDIA,
// CUDA, ROCm, Neuron and Gaudi drivers, libibverbs and NIC firmware), read
// from files under a root so that a copied system tree reports like the
// machine it came from. On a live machine it also asks the CUDA driver API
// (tensor/cuda, loaded at run time) for its GPUs and says which rdma
// providers can run; ApplyCUDA lends those GPUs to topology discovery, which
// `tensorlane topo` uses too.
package envinfo
