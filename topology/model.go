package topology

import (
	"fmt"
	"sort"
)

// DeviceKind is the broad class of an accelerator. It is vendor-neutral: an
// H100 and an MI355X are both KindGPU; the Vendor and Model fields tell them
// apart.
type DeviceKind string

const (
	KindGPU    DeviceKind = "gpu"    // NVIDIA, AMD, Intel GPUs
	KindTPU    DeviceKind = "tpu"    // Google TPU chips
	KindNeuron DeviceKind = "neuron" // AWS Trainium / Inferentia
	KindHPU    DeviceKind = "hpu"    // Intel Gaudi
)

// LinkKind says what physically joins two endpoints of a Link.
type LinkKind string

const (
	LinkNVLink     LinkKind = "nvlink"     // NVIDIA NVLink, direct or through NVSwitch
	LinkXGMI       LinkKind = "xgmi"       // AMD Infinity Fabric between GPUs
	LinkICI        LinkKind = "ici"        // TPU inter-chip interconnect
	LinkNeuronLink LinkKind = "neuronlink" // AWS NeuronLink
	LinkRoCE       LinkKind = "roce"       // Gaudi integrated RoCE scale-up ports
	LinkPCIe       LinkKind = "pcie"       // device to its PCIe switch or root port
	LinkUPI        LinkKind = "upi"        // CPU socket to CPU socket (Intel UPI / AMD xGMI-socket)
)

// IsDeviceLink reports whether the link kind is a direct device-to-device
// fabric (one that a peer copy can use without touching host memory).
func (k LinkKind) IsDeviceLink() bool {
	switch k {
	case LinkNVLink, LinkXGMI, LinkICI, LinkNeuronLink, LinkRoCE:
		return true
	}
	return false
}

// Cluster is the whole machine park: hosts grouped by labels into racks,
// NVLink domains, TPU slices and zones.
type Cluster struct {
	Name  string  `json:"name"`
	Hosts []*Host `json:"hosts"`
}

// Host is one machine: NUMA nodes, PCIe switches, devices and NICs, and the
// links between them.
type Host struct {
	// ID is unique in the cluster, e.g. "h0". Runtimes claim a host by ID.
	ID string `json:"id"`
	// Preset names the preset the host came from ("dgx-h100"), or "" when
	// discovered.
	Preset string `json:"preset,omitempty"`
	// Labels place the host in the cluster: LabelRack, LabelNVLinkDomain,
	// LabelSlice, LabelZone, LabelBlock and any the operator adds.
	Labels   map[string]string `json:"labels,omitempty"`
	NUMA     []NUMANode        `json:"numa"`
	Switches []PCIeSwitch      `json:"pcie_switches,omitempty"`
	Devices  []Device          `json:"devices"`
	NICs     []NIC             `json:"nics,omitempty"`
	// Links between devices of this host (NVLink, xGMI, ...). PCIe
	// attachment is given by the PCIeSwitch fields, not by links.
	Links []Link `json:"links,omitempty"`
	// Simulated is true when the host is a model only: its devices are
	// memory arenas, not hardware.
	Simulated bool `json:"simulated,omitempty"`
}

// Well-known label keys.
const (
	LabelRack         = "topology.tensorlane.io/rack"
	LabelBlock        = "topology.tensorlane.io/block"
	LabelNVLinkDomain = "topology.tensorlane.io/nvlink-domain"
	LabelSlice        = "topology.tensorlane.io/slice"
	LabelZone         = "topology.kubernetes.io/zone"
	LabelAccelerator  = "tensorlane.io/accelerator"
)

// NUMANode is one memory locality domain of a host.
type NUMANode struct {
	ID          int    `json:"id"`
	CPUs        string `json:"cpus"` // Linux cpulist, e.g. "0-55,112-167"
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	// Distances to every NUMA node of the host, indexed by node ID (the
	// ACPI SLIT values Linux reports; 10 is local).
	Distances []int `json:"distances,omitempty"`
}

// PCIeSwitch is a PCIe switch or root port under which devices and NICs sit.
// Parent is the ID of the switch above, or "" for a root complex directly
// under the CPU of NUMA node NUMA.
type PCIeSwitch struct {
	ID     string `json:"id"`
	NUMA   int    `json:"numa"`
	Parent string `json:"parent,omitempty"`
}

// Device is one accelerator.
type Device struct {
	Index       int        `json:"index"`
	Kind        DeviceKind `json:"kind"`
	Vendor      string     `json:"vendor"`
	Model       string     `json:"model"`
	MemoryBytes int64      `json:"memory_bytes"`
	NUMA        int        `json:"numa"`
	PCIeSwitch  string     `json:"pcie_switch,omitempty"`
	BusID       string     `json:"bus_id,omitempty"`
}

// NIC is one network interface. RDMA NICs also carry the verbs device name.
type NIC struct {
	Name       string  `json:"name"`
	RDMADevice string  `json:"rdma_device,omitempty"` // e.g. "mlx5_0"; "" when not RDMA-capable
	SpeedGbps  float64 `json:"speed_gbps"`
	NUMA       int     `json:"numa"`
	PCIeSwitch string  `json:"pcie_switch,omitempty"`
	BusID      string  `json:"bus_id,omitempty"`
}

// RDMA reports whether the NIC can do remote direct memory access.
func (n NIC) RDMA() bool { return n.RDMADevice != "" }

// Link is a direct device fabric link between two devices of a host, given
// by device index. Lanes counts parallel links (NV18 = 18 NVLinks); GBps is
// the total unidirectional bandwidth in gigabytes per second.
type Link struct {
	A     int      `json:"a"`
	B     int      `json:"b"`
	Kind  LinkKind `json:"kind"`
	Lanes int      `json:"lanes,omitempty"`
	GBps  float64  `json:"gbps"`
}

// Host returns the host with the given ID.
func (c *Cluster) Host(id string) (*Host, bool) {
	if c == nil {
		return nil, false
	}
	for _, h := range c.Hosts {
		if h.ID == id {
			return h, true
		}
	}
	return nil, false
}

// HostIDs returns the IDs of all hosts in order.
func (c *Cluster) HostIDs() []string {
	ids := make([]string, len(c.Hosts))
	for i, h := range c.Hosts {
		ids[i] = h.ID
	}
	return ids
}

// Device returns the device with the given index.
func (h *Host) Device(index int) (Device, bool) {
	for _, d := range h.Devices {
		if d.Index == index {
			return d, true
		}
	}
	return Device{}, false
}

// Switch returns the PCIe switch with the given ID.
func (h *Host) Switch(id string) (PCIeSwitch, bool) {
	for _, s := range h.Switches {
		if s.ID == id {
			return s, true
		}
	}
	return PCIeSwitch{}, false
}

// LinkBetween returns the strongest device link between devices a and b.
func (h *Host) LinkBetween(a, b int) (Link, bool) {
	var best Link
	found := false
	for _, l := range h.Links {
		if (l.A == a && l.B == b) || (l.A == b && l.B == a) {
			if !found || l.GBps > best.GBps {
				best, found = l, true
			}
		}
	}
	return best, found
}

// NearestNICs returns the host's RDMA NICs ordered by closeness to device
// index: same PCIe switch first, then same NUMA node, then the rest; ties
// keep host order. It returns nil if the host has no RDMA NIC.
func (h *Host) NearestNICs(device int) []NIC {
	d, ok := h.Device(device)
	if !ok {
		return nil
	}
	var nics []NIC
	for _, n := range h.NICs {
		if n.RDMA() {
			nics = append(nics, n)
		}
	}
	rank := func(n NIC) int {
		switch {
		case d.PCIeSwitch != "" && n.PCIeSwitch == d.PCIeSwitch:
			return 0
		case n.NUMA == d.NUMA:
			return 1
		}
		return 2
	}
	sort.SliceStable(nics, func(i, j int) bool { return rank(nics[i]) < rank(nics[j]) })
	return nics
}

// Validate checks the internal consistency of the cluster: unique host IDs,
// devices and links that refer to existing indices, switches that exist.
func (c *Cluster) Validate() error {
	seen := map[string]bool{}
	for _, h := range c.Hosts {
		if h.ID == "" {
			return fmt.Errorf("topology: host without ID")
		}
		if seen[h.ID] {
			return fmt.Errorf("topology: duplicate host ID %q", h.ID)
		}
		seen[h.ID] = true
		idx := map[int]bool{}
		for _, d := range h.Devices {
			if idx[d.Index] {
				return fmt.Errorf("topology: host %s: duplicate device index %d", h.ID, d.Index)
			}
			idx[d.Index] = true
			if d.PCIeSwitch != "" {
				if _, ok := h.Switch(d.PCIeSwitch); !ok {
					return fmt.Errorf("topology: host %s: device %d under unknown switch %q", h.ID, d.Index, d.PCIeSwitch)
				}
			}
		}
		for _, l := range h.Links {
			if !idx[l.A] || !idx[l.B] {
				return fmt.Errorf("topology: host %s: link %d-%d names an unknown device", h.ID, l.A, l.B)
			}
		}
		for _, n := range h.NICs {
			if n.PCIeSwitch != "" {
				if _, ok := h.Switch(n.PCIeSwitch); !ok {
					return fmt.Errorf("topology: host %s: NIC %s under unknown switch %q", h.ID, n.Name, n.PCIeSwitch)
				}
			}
		}
	}
	return nil
}
