package topology

import (
	"fmt"
	"sort"

	"github.com/tensorlane/tensorlane/tensor"
)

// DeviceKind is the broad class of an accelerator. It is vendor-neutral: an
// H100 and an MI355X are both KindGPU; the Vendor and Model fields tell them
// apart. It is tensor.DeviceKind itself (one device-kind type for the model
// and the memory that lives on it), so a topology device's kind is a
// tensor.DeviceID's kind without a conversion.
type DeviceKind = tensor.DeviceKind

const (
	KindGPU    = tensor.GPU    // NVIDIA, AMD, Intel GPUs
	KindTPU    = tensor.TPU    // Google TPU chips
	KindNeuron = tensor.Neuron // AWS Trainium / Inferentia
	KindHPU    = tensor.HPU    // Intel Gaudi
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
	// LabelPCIeP2P marks a host whose accelerators copy to each other over
	// PCIe (peer-to-peer through a switch, no host memory): the value is
	// the farthest PCIe class that still does it and the throughput, e.g.
	// "PXB:50" (PIX and PXB pairs, 50 GB/s each way). Pairs farther apart
	// go through the host bridge and stage in host memory.
	LabelPCIeP2P     = "topology.tensorlane.io/pcie-p2p"
	LabelZone        = "topology.kubernetes.io/zone"
	LabelAccelerator = "tensorlane.io/accelerator"
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
	// BusID is the bridge's PCI address when discovered; Vendor its vendor
	// ("broadcom", "microchip", "nvidia" for an NVSwitch-side bridge).
	BusID  string `json:"bus_id,omitempty"`
	Vendor string `json:"vendor,omitempty"`
	// HostBridge marks a PCIe root complex: endpoints directly under it
	// (as on a VM's root bus) meet at the host bridge, PHB, not PIX.
	HostBridge bool `json:"host_bridge,omitempty"`
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
	// The fields below are filled by discovery where known.

	// UUID is the vendor's stable identity (NVML UUID, KFD unique id).
	UUID string `json:"uuid,omitempty"`
	// Driver is the kernel driver bound to the device ("nvidia", "amdgpu").
	Driver string `json:"driver,omitempty"`
	// DevNode is the character device user space opens ("/dev/accel0").
	DevNode string `json:"dev_node,omitempty"`
	// PCIe is the negotiated link to the device's parent.
	PCIe *PCIeLink `json:"pcie,omitempty"`
	// Fabric identifies a multi-node device fabric the device belongs to
	// (NVML fabric cluster UUID and clique, an xGMI hive id).
	Fabric string `json:"fabric,omitempty"`
}

// PCIeLink is a negotiated PCIe link: the lesser of the device's and its
// parent's current speed and width.
type PCIeLink struct {
	GTps  float64 `json:"gtps"` // transfer rate per lane, GT/s (32 = Gen5)
	Width int     `json:"width"`
}

// Gen returns the PCIe generation of the link rate, 0 when unknown.
func (l PCIeLink) Gen() int {
	switch {
	case l.GTps >= 64:
		return 6
	case l.GTps >= 32:
		return 5
	case l.GTps >= 16:
		return 4
	case l.GTps >= 8:
		return 3
	case l.GTps >= 5:
		return 2
	case l.GTps >= 2.5:
		return 1
	}
	return 0
}

// NIC is one network interface. RDMA NICs also carry the verbs device name.
type NIC struct {
	Name       string  `json:"name"`
	RDMADevice string  `json:"rdma_device,omitempty"` // e.g. "mlx5_0"; "" when not RDMA-capable
	SpeedGbps  float64 `json:"speed_gbps"`
	NUMA       int     `json:"numa"`
	PCIeSwitch string  `json:"pcie_switch,omitempty"`
	BusID      string  `json:"bus_id,omitempty"`
	// LinkLayer is the RDMA port's link layer: "InfiniBand" or "Ethernet"
	// (RoCE); "" when unknown or not RDMA.
	LinkLayer string `json:"link_layer,omitempty"`
	// State is the port state ("ACTIVE", "DOWN") or the netdev operstate.
	State string `json:"state,omitempty"`
	// Driver is the kernel driver bound to the NIC ("mlx5_core", "efa").
	Driver string `json:"driver,omitempty"`
	// Firmware is the NIC firmware version where sysfs exposes it.
	Firmware string `json:"firmware,omitempty"`
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
		if h != nil && h.ID == id {
			return h, true
		}
	}
	return nil, false
}

// HostIDs returns the IDs of all hosts in order.
func (c *Cluster) HostIDs() []string {
	if c == nil {
		return nil
	}
	ids := make([]string, 0, len(c.Hosts))
	for _, h := range c.Hosts {
		if h != nil {
			ids = append(ids, h.ID)
		}
	}
	return ids
}

// Device returns the device with the given index.
func (h *Host) Device(index int) (Device, bool) {
	if h == nil {
		return Device{}, false
	}
	for _, d := range h.Devices {
		if d.Index == index {
			return d, true
		}
	}
	return Device{}, false
}

// Switch returns the PCIe switch with the given ID.
func (h *Host) Switch(id string) (PCIeSwitch, bool) {
	if h == nil {
		return PCIeSwitch{}, false
	}
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
	if h == nil {
		return best, false
	}
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
// index: by the PCIe path class between device and NIC (PIX, PXB, PHB,
// NODE, then SYS: same switch first, then the same NUMA node by fewest
// PCIe hops, then other nodes); ties keep host order. It returns nil if the
// host has no RDMA NIC or no such device.
func (h *Host) NearestNICs(device int) []NIC {
	d, ok := h.Device(device)
	if !ok {
		return nil
	}
	type ranked struct {
		nic  NIC
		rank PathClass
	}
	var rs []ranked
	for _, n := range h.NICs {
		if n.RDMA() {
			rs = append(rs, ranked{n, h.placementClass(d.NUMA, d.PCIeSwitch, n.NUMA, n.PCIeSwitch)})
		}
	}
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].rank < rs[j].rank })
	var nics []NIC
	for _, r := range rs {
		nics = append(nics, r.nic)
	}
	return nics
}

// NIC returns the NIC with the given interface or RDMA device name.
func (h *Host) NIC(name string) (NIC, bool) {
	if h == nil {
		return NIC{}, false
	}
	for _, n := range h.NICs {
		if n.Name == name || (n.RDMADevice != "" && n.RDMADevice == name) {
			return n, true
		}
	}
	return NIC{}, false
}

// NICPath classifies the PCIe path between a device and a NIC of the host
// (PIX, PXB, PHB, NODE or SYS), as `nvidia-smi topo -m` does for its NIC
// columns. An unknown device or NIC gives PathSYS.
func (h *Host) NICPath(device int, nic string) Path {
	d, ok := h.Device(device)
	n, ok2 := h.NIC(nic)
	if !ok || !ok2 {
		return Path{Class: PathSYS}
	}
	return Path{Class: h.placementClass(d.NUMA, d.PCIeSwitch, n.NUMA, n.PCIeSwitch)}
}

// Validate checks the internal consistency of the cluster: unique host IDs,
// devices and links that refer to existing indices, switches that exist.
func (c *Cluster) Validate() error {
	seen := map[string]bool{}
	for _, h := range c.Hosts {
		if h == nil {
			return fmt.Errorf("topology: nil host")
		}
		if h.ID == "" {
			return fmt.Errorf("topology: host without ID")
		}
		if seen[h.ID] {
			return fmt.Errorf("topology: duplicate host ID %q", h.ID)
		}
		seen[h.ID] = true
		switches := make(map[string]bool, len(h.Switches))
		for _, s := range h.Switches {
			switches[s.ID] = true
		}
		idx := make(map[int]bool, len(h.Devices))
		for _, d := range h.Devices {
			if idx[d.Index] {
				return fmt.Errorf("topology: host %s: duplicate device index %d", h.ID, d.Index)
			}
			idx[d.Index] = true
			if d.PCIeSwitch != "" && !switches[d.PCIeSwitch] {
				return fmt.Errorf("topology: host %s: device %d under unknown switch %q", h.ID, d.Index, d.PCIeSwitch)
			}
		}
		for _, l := range h.Links {
			if !idx[l.A] || !idx[l.B] {
				return fmt.Errorf("topology: host %s: link %d-%d names an unknown device", h.ID, l.A, l.B)
			}
		}
		for _, n := range h.NICs {
			if n.PCIeSwitch != "" && !switches[n.PCIeSwitch] {
				return fmt.Errorf("topology: host %s: NIC %s under unknown switch %q", h.ID, n.Name, n.PCIeSwitch)
			}
		}
	}
	return nil
}
