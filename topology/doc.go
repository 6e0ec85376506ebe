// Package topology is tensorlane's model of the hardware: a cluster of hosts,
// each with NUMA nodes, PCIe switches, accelerators and NICs, and the device
// links (NVLink, xGMI, ICI, NeuronLink, RoCE scale-up) between them. Hosts
// carry labels that place them in racks, blocks, NVLink domains, TPU slices
// and zones; Cluster.Domains lists those groups.
//
// Three ways to get a model:
//
//   - Presets build simulated clusters of well-known machines: Preset,
//     PresetCluster (racks) and NewCluster (racks, blocks, TPU slice
//     shapes, zone). See Presets for the names.
//   - Discover reads Linux sysfs under a configurable root (pure Go, no
//     cgo): NUMA nodes, the PCIe tree, NICs and RDMA devices, then each
//     vendor Plugin (NVIDIA, AMD, Google TPU, AWS Neuron, Intel Gaudi, and
//     any registered with Register). Whatever it cannot read becomes a
//     Warning naming the file; it never panics on bad input.
//   - Load and LoadFile read a topology file, the JSON that Dump writes;
//     a dump loads back unchanged.
//
// The fabric planner asks PathBetween how two memory locations are connected
// (SELF, NV#, PIX, PXB, PHB, NODE, SYS, MNNVL, NET), NICPath how a device
// reaches a NIC and NearestNICs which NIC serves a device; the scheduler
// places actors with the same model. Plugins are checked by the conformance
// suite in topology/topocheck, which also builds fake sysfs trees (tests run
// it through topology/topotest).
package topology
