// Package render draws a topology.Cluster for people and tools: a tree of
// hosts, NUMA nodes, PCIe switches, devices and NICs (Tree), the device/NIC
// path matrix in the style of nvidia-smi topo -m (Matrix), a JSON view
// (JSON) and a Graphviz graph (Dot). `tensorlane topo` is a thin shell over
// it; the renderers read the hardware model only, so any tool can use them.
package render
