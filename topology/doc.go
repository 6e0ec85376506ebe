// Package topology is tensorlane's model of the hardware: a cluster of hosts,
// each with NUMA nodes, PCIe switches, accelerators and NICs, and the device
// links (NVLink, xGMI, ICI, ...) between them. Hosts carry labels that place
// them in racks, NVLink domains, TPU slices and zones.
//
// The fabric planner asks PathBetween how two memory locations are connected
// (SELF, NV#, PIX, PXB, PHB, NODE, SYS, MNNVL, NET) and NearestNICs which NIC
// serves a device; the scheduler places actors with the same model. Presets
// build simulated clusters of well-known machines.
package topology
