package topology

import (
	"sort"
	"strconv"
)

// DomainKind names a level of grouping above or across devices.
type DomainKind string

const (
	// DomainNVLink: GPUs that reach each other over NVLink, within one host
	// (an NVSwitch board) or across hosts that share LabelNVLinkDomain
	// (a multi-node NVLink domain such as a GB200 NVL72 rack).
	DomainNVLink DomainKind = "nvlink"
	// DomainXGMI: an AMD xGMI hive.
	DomainXGMI DomainKind = "xgmi"
	// DomainICI: TPU chips of one host joined by ICI, for hosts not in a slice.
	DomainICI DomainKind = "ici"
	// DomainNeuronLink: Trainium chips joined by NeuronLink.
	DomainNeuronLink DomainKind = "neuronlink"
	// DomainRoCE: Gaudi accelerators joined by their scale-up RoCE ports.
	DomainRoCE DomainKind = "roce"
	// DomainSlice: the hosts of one TPU slice (LabelSlice); the chips
	// reach each other over ICI.
	DomainSlice DomainKind = "slice"
	// DomainRack, DomainBlock, DomainZone: hosts sharing LabelRack,
	// LabelBlock or LabelZone.
	DomainRack  DomainKind = "rack"
	DomainBlock DomainKind = "block"
	DomainZone  DomainKind = "zone"
)

// domainOrder is the order Domains reports kinds in: device fabrics first,
// then the placement levels from small to large.
var domainOrder = []DomainKind{
	DomainNVLink, DomainXGMI, DomainICI, DomainNeuronLink, DomainRoCE,
	DomainSlice, DomainRack, DomainBlock, DomainZone,
}

// Domain is a named group of hosts and their devices.
type Domain struct {
	Kind DomainKind `json:"kind"`
	// Name is the label value ("rack3", "nvl72-0") for label-defined
	// domains, or "<host>/<kind>" for a device fabric inside one host.
	Name string `json:"name"`
	// Link is the device fabric that joins the members, if any.
	Link LinkKind `json:"link,omitempty"`
	// Hosts are the member hosts in cluster order.
	Hosts []string `json:"hosts"`
	// Devices are the member devices in cluster order.
	Devices []Endpoint `json:"devices"`
}

// DeviceIDs returns the members as "host/index" strings.
func (d Domain) DeviceIDs() []string {
	ids := make([]string, len(d.Devices))
	for i, e := range d.Devices {
		ids[i] = e.String()
	}
	return ids
}

func linkDomainKind(k LinkKind) DomainKind {
	switch k {
	case LinkNVLink:
		return DomainNVLink
	case LinkXGMI:
		return DomainXGMI
	case LinkICI:
		return DomainICI
	case LinkNeuronLink:
		return DomainNeuronLink
	case LinkRoCE:
		return DomainRoCE
	}
	return ""
}

var labelDomains = []struct {
	kind  DomainKind
	label string
	link  LinkKind
}{
	{DomainSlice, LabelSlice, LinkICI},
	{DomainRack, LabelRack, ""},
	{DomainBlock, LabelBlock, ""},
	{DomainZone, LabelZone, ""},
}

// Domains returns every domain of the cluster: device-fabric domains
// (NVLink, xGMI, ICI, NeuronLink, RoCE scale-up; one per connected group of
// devices in a host, or one per LabelNVLinkDomain value across hosts) and
// label domains (TPU slice, rack, block, zone). The order is deterministic:
// by kind (as listed in DomainKind), then by first appearance in host order.
// Single devices without any device link form no domain.
func (c *Cluster) Domains() []Domain {
	if c == nil {
		return nil
	}
	var out []Domain
	byKind := map[DomainKind][]Domain{}
	multi := map[string]int{} // nvlink label -> index in byKind[DomainNVLink]
	for _, h := range c.Hosts {
		if h == nil {
			continue
		}
		seen := map[DomainKind]int{}
		for _, comp := range h.linkComponents() {
			kind := linkDomainKind(comp.kind)
			if kind == "" {
				continue
			}
			if comp.kind == LinkICI && h.Labels[LabelSlice] != "" {
				continue // reported as the slice
			}
			eps := make([]Endpoint, len(comp.devices))
			for i, d := range comp.devices {
				eps[i] = Endpoint{Host: h.ID, Device: d}
			}
			if dom := h.Labels[LabelNVLinkDomain]; dom != "" && comp.kind == LinkNVLink {
				if i, ok := multi[dom]; ok {
					d := &byKind[kind][i]
					if d.Hosts[len(d.Hosts)-1] != h.ID {
						d.Hosts = append(d.Hosts, h.ID)
					}
					d.Devices = append(d.Devices, eps...)
					continue
				}
				multi[dom] = len(byKind[kind])
				byKind[kind] = append(byKind[kind], Domain{Kind: kind, Name: dom, Link: LinkNVLink, Hosts: []string{h.ID}, Devices: eps})
				continue
			}
			name := h.ID + "/" + string(kind)
			if n := seen[kind]; n > 0 {
				name += "-" + strconv.Itoa(n)
			}
			seen[kind]++
			byKind[kind] = append(byKind[kind], Domain{Kind: kind, Name: name, Link: comp.kind, Hosts: []string{h.ID}, Devices: eps})
		}
	}
	for _, ld := range labelDomains {
		idx := map[string]int{}
		for _, h := range c.Hosts {
			if h == nil {
				continue
			}
			v := h.Labels[ld.label]
			if v == "" {
				continue
			}
			i, ok := idx[v]
			if !ok {
				i = len(byKind[ld.kind])
				idx[v] = i
				byKind[ld.kind] = append(byKind[ld.kind], Domain{Kind: ld.kind, Name: v, Link: ld.link})
			}
			d := &byKind[ld.kind][i]
			d.Hosts = append(d.Hosts, h.ID)
			for _, dev := range h.Devices {
				d.Devices = append(d.Devices, Endpoint{Host: h.ID, Device: dev.Index})
			}
		}
	}
	for _, k := range domainOrder {
		out = append(out, byKind[k]...)
	}
	return out
}

// DomainsOf returns the domains of one kind, in the order of Domains.
func (c *Cluster) DomainsOf(kind DomainKind) []Domain {
	var out []Domain
	for _, d := range c.Domains() {
		if d.Kind == kind {
			out = append(out, d)
		}
	}
	return out
}

// DomainOf returns the domain of the given kind that holds the endpoint.
// For a HostMemory endpoint it returns the domain that holds the host.
func (c *Cluster) DomainOf(e Endpoint, kind DomainKind) (Domain, bool) {
	for _, d := range c.DomainsOf(kind) {
		if e.Device == HostMemory {
			for _, h := range d.Hosts {
				if h == e.Host {
					return d, true
				}
			}
			continue
		}
		for _, m := range d.Devices {
			if m == e {
				return d, true
			}
		}
	}
	return Domain{}, false
}

type linkComponent struct {
	kind    LinkKind
	devices []int
}

// linkComponents groups the host's devices into connected components per
// device-link kind. Components of one device are left out.
func (h *Host) linkComponents() []linkComponent {
	kinds := map[LinkKind]bool{}
	var order []LinkKind
	for _, l := range h.Links {
		if l.Kind.IsDeviceLink() && !kinds[l.Kind] {
			kinds[l.Kind] = true
			order = append(order, l.Kind)
		}
	}
	var out []linkComponent
	for _, k := range order {
		parent := map[int]int{}
		var find func(int) int
		find = func(x int) int {
			for {
				p, ok := parent[x]
				if !ok || p == x {
					return x
				}
				parent[x] = parent[p]
				x = p
			}
		}
		for _, l := range h.Links {
			if l.Kind != k {
				continue
			}
			if _, ok := parent[l.A]; !ok {
				parent[l.A] = l.A
			}
			if _, ok := parent[l.B]; !ok {
				parent[l.B] = l.B
			}
			ra, rb := find(l.A), find(l.B)
			if ra != rb {
				parent[ra] = rb
			}
		}
		groups := map[int][]int{}
		var roots []int
		for _, d := range h.Devices {
			if _, ok := parent[d.Index]; !ok {
				continue
			}
			r := find(d.Index)
			if _, ok := groups[r]; !ok {
				roots = append(roots, r)
			}
			groups[r] = append(groups[r], d.Index)
		}
		for _, r := range roots {
			if len(groups[r]) > 1 {
				g := groups[r]
				sort.Ints(g)
				out = append(out, linkComponent{kind: k, devices: g})
			}
		}
	}
	return out
}
