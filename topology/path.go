package topology

import (
	"fmt"
	"strconv"
	"strings"
)

// PathClass ranks how two endpoints are connected, best first, in the spirit
// of NCCL's path types and `nvidia-smi topo -m`.
type PathClass int

const (
	PathSELF  PathClass = iota // the same device
	PathNV                     // a direct device link (NVLink, xGMI, ICI, NeuronLink)
	PathPIX                    // one PCIe switch
	PathPXB                    // several PCIe switches, no host bridge crossed
	PathPHB                    // through a PCIe host bridge (the CPU's root complex)
	PathNODE                   // different host bridges within one NUMA node
	PathSYS                    // across NUMA nodes (the SMP interconnect)
	PathMNNVL                  // different hosts of one multi-node device domain (NVLink domain, TPU slice over ICI)
	PathNET                    // different hosts over the network
)

var pathNames = [...]string{"SELF", "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "MNNVL", "NET"}

func (p PathClass) String() string {
	if p < 0 || int(p) >= len(pathNames) {
		return fmt.Sprintf("PathClass(%d)", int(p))
	}
	return pathNames[p]
}

// SameHost reports whether the class connects endpoints of one host.
func (p PathClass) SameHost() bool { return p <= PathSYS }

// HostMemory is the device index that names a host's own memory (CPU DRAM)
// in an Endpoint.
const HostMemory = -1

// Endpoint names a memory location in the cluster: a device of a host, or the
// host's memory when Device is HostMemory.
type Endpoint struct {
	Host   string `json:"host"`
	Device int    `json:"device"`
}

func (e Endpoint) String() string {
	if e.Device == HostMemory {
		return e.Host + "/cpu"
	}
	return fmt.Sprintf("%s/%d", e.Host, e.Device)
}

// Path is the connection between two endpoints: its class, and for device
// links the link kind, lane count and bandwidth.
type Path struct {
	Class PathClass `json:"class"`
	Link  LinkKind  `json:"link,omitempty"`
	Lanes int       `json:"lanes,omitempty"`
	GBps  float64   `json:"gbps,omitempty"`
}

// String gives the nvidia-smi style label: "NV18", "PIX", "NET". Device
// links other than NVLink are named by their fabric, with the lane count
// when there is more than one: "XGMI", "ICI", "NL" (NeuronLink), "ROCE3".
func (p Path) String() string {
	if p.Class == PathNV {
		switch p.Link {
		case LinkNVLink, "":
			if p.Lanes > 0 {
				return fmt.Sprintf("NV%d", p.Lanes)
			}
		default:
			name := linkShort(p.Link)
			if p.Lanes > 1 {
				return fmt.Sprintf("%s%d", name, p.Lanes)
			}
			return name
		}
	}
	return p.Class.String()
}

func linkShort(k LinkKind) string {
	switch k {
	case LinkXGMI:
		return "XGMI"
	case LinkICI:
		return "ICI"
	case LinkNeuronLink:
		return "NL"
	case LinkRoCE:
		return "ROCE"
	}
	return strings.ToUpper(string(k))
}

func (h *Host) deviceKind(i int) DeviceKind {
	d, ok := h.Device(i)
	if !ok {
		return ""
	}
	return d.Kind
}

// PathBetween classifies the connection between two endpoints. Unknown hosts
// or devices are reported as PathNET (nothing better can be assumed).
func (c *Cluster) PathBetween(a, b Endpoint) Path {
	ha, okA := c.Host(a.Host)
	hb, okB := c.Host(b.Host)
	if !okA || !okB {
		return Path{Class: PathNET}
	}
	if ha != hb {
		if a.Device != HostMemory && b.Device != HostMemory {
			if dom := ha.Labels[LabelNVLinkDomain]; dom != "" && dom == hb.Labels[LabelNVLinkDomain] {
				return Path{Class: PathMNNVL, Link: LinkNVLink}
			}
			if sl := ha.Labels[LabelSlice]; sl != "" && sl == hb.Labels[LabelSlice] &&
				ha.deviceKind(a.Device) == KindTPU && hb.deviceKind(b.Device) == KindTPU {
				return Path{Class: PathMNNVL, Link: LinkICI}
			}
		}
		return Path{Class: PathNET}
	}
	if a.Device == b.Device {
		return Path{Class: PathSELF}
	}
	if a.Device != HostMemory && b.Device != HostMemory {
		if l, ok := ha.LinkBetween(a.Device, b.Device); ok && l.Kind.IsDeviceLink() {
			return Path{Class: PathNV, Link: l.Kind, Lanes: l.Lanes, GBps: l.GBps}
		}
	}
	class := ha.pcieClass(a.Device, b.Device)
	if a.Device != HostMemory && b.Device != HostMemory {
		if limit, gbps, ok := ha.pcieP2P(); ok && class != PathSYS && class <= limit {
			return Path{Class: class, Link: LinkPCIe, GBps: gbps}
		}
	}
	return Path{Class: class}
}

// PeerToPeer reports whether the path is a device-to-device one a peer
// copy can take without staging in host memory: a device link (NV#), or
// PCIe peer-to-peer through a switch on hosts labelled LabelPCIeP2P.
func (p Path) PeerToPeer() bool {
	return p.Class == PathNV || p.Link == LinkPCIe
}

// pcieP2P parses the host's LabelPCIeP2P: the farthest class that does
// peer-to-peer, and its throughput.
func (h *Host) pcieP2P() (PathClass, float64, bool) {
	v := h.Labels[LabelPCIeP2P]
	if v == "" {
		return 0, 0, false
	}
	name, rate, _ := strings.Cut(v, ":")
	gbps, err := strconv.ParseFloat(rate, 64)
	if err != nil || gbps <= 0 {
		return 0, 0, false
	}
	for _, c := range []PathClass{PathPIX, PathPXB, PathPHB, PathNODE} {
		if c.String() == name {
			return c, gbps, true
		}
	}
	return 0, 0, false
}

// pcieClass classifies two endpoints of one host by their PCIe placement.
func (h *Host) pcieClass(a, b int) PathClass {
	if a == HostMemory || b == HostMemory {
		// Host memory is reached through the device's host bridge; the
		// host stages through memory local to the device.
		return PathPHB
	}
	da, okA := h.Device(a)
	db, okB := h.Device(b)
	if !okA || !okB {
		return PathSYS
	}
	return h.placementClass(da.NUMA, da.PCIeSwitch, db.NUMA, db.PCIeSwitch)
}

// placementClass classifies two PCIe endpoints given by NUMA node and the
// switch they sit under: PIX under one switch, PXB when they share a switch
// further up, PHB when they meet only at the top of the tree (the root
// complex or root port), NODE for different trees of one NUMA node, SYS
// across nodes or when nothing is known.
func (h *Host) placementClass(na int, sa string, nb int, sb string) PathClass {
	crossNUMA := na >= 0 && nb >= 0 && na != nb
	if sa != "" && sa == sb {
		if sw, ok := h.Switch(sa); ok && sw.HostBridge {
			if crossNUMA {
				return PathSYS
			}
			return PathPHB
		}
		return PathPIX
	}
	ca, cb := h.switchChain(sa), h.switchChain(sb)
	if len(ca) > 0 && len(cb) > 0 {
		rootA := ca[len(ca)-1]
		inB := make(map[string]bool, len(cb))
		for _, y := range cb {
			inB[y] = true
		}
		for _, x := range ca {
			if inB[x] {
				if x == rootA {
					if crossNUMA {
						return PathSYS
					}
					return PathPHB
				}
				return PathPXB
			}
		}
	}
	if na >= 0 && na == nb {
		return PathNODE
	}
	return PathSYS
}

// switchChain lists the switch and its ancestors, nearest first.
func (h *Host) switchChain(id string) []string {
	var chain []string
	for id != "" && len(chain) < 64 {
		chain = append(chain, id)
		s, ok := h.Switch(id)
		if !ok {
			break
		}
		id = s.Parent
	}
	return chain
}
