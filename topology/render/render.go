package render

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/tensorlane/tensorlane/topology"
)

// Source says where a topology came from, for the renderers' headings.
type Source struct {
	Kind     string             // "discovered", "preset", "file"
	Warnings []topology.Warning // discovery's warnings, listed after the tree and in JSON
}

// ---- JSON ----

// View is the JSON form of a cluster (topo --json): hosts with their
// NUMA nodes, devices (with the nearest NIC), NICs and device links, and
// the cluster's domains.
type View struct {
	Name     string   `json:"name"`
	Source   string   `json:"source"`
	Hosts    []Host   `json:"hosts"`
	Domains  []Domain `json:"domains"`
	Warnings []string `json:"warnings,omitempty"`
}

// Host is one host of a View.
type Host struct {
	Name         string            `json:"name"`
	Labels       map[string]string `json:"labels,omitempty"`
	Simulated    bool              `json:"simulated,omitempty"`
	Accelerators bool              `json:"accelerators"`
	CPUs         int               `json:"cpus"`
	NUMA         []NUMA            `json:"numa"`
	Devices      []Device          `json:"devices"`
	NICs         []NIC             `json:"nics"`
	Links        []Link            `json:"links"`
}

// NUMA is one NUMA node of a Host.
type NUMA struct {
	ID          int    `json:"id"`
	CPUs        string `json:"cpus"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	Distances   []int  `json:"distances,omitempty"`
}

// Device is one accelerator of a Host.
type Device struct {
	ID          string `json:"id"`
	Index       int    `json:"index"`
	Kind        string `json:"kind"`
	Vendor      string `json:"vendor"`
	Model       string `json:"model"`
	MemoryBytes int64  `json:"memory_bytes"`
	NUMA        int    `json:"numa"`
	BusID       string `json:"bus_id,omitempty"`
	PCIeSwitch  string `json:"pcie_switch,omitempty"`
	NearestNIC  string `json:"nearest_nic,omitempty"`
	NICPath     string `json:"nearest_nic_path,omitempty"`
}

// NIC is one network interface of a Host.
type NIC struct {
	Name       string  `json:"name"`
	RDMADevice string  `json:"rdma_device,omitempty"`
	SpeedGbps  float64 `json:"speed_gbps"`
	NUMA       int     `json:"numa"`
	BusID      string  `json:"bus_id,omitempty"`
	LinkLayer  string  `json:"link_layer,omitempty"`
	State      string  `json:"state,omitempty"`
}

// Link is one direct device link of a Host.
type Link struct {
	A     string  `json:"a"`
	B     string  `json:"b"`
	Kind  string  `json:"kind"`
	Lanes int     `json:"lanes,omitempty"`
	GBps  float64 `json:"gbps"`
}

// Domain is one domain of the cluster: an NVLink domain, a rack, a TPU slice.
type Domain struct {
	Kind    string   `json:"kind"`
	Name    string   `json:"name"`
	Link    string   `json:"link,omitempty"`
	Hosts   []string `json:"hosts"`
	Devices []string `json:"devices"`
}

// JSON builds the View of c.
func JSON(c *topology.Cluster, src *Source) View {
	v := View{Name: c.Name, Source: src.Kind, Hosts: []Host{}, Domains: []Domain{}}
	for _, h := range c.Hosts {
		hj := Host{Name: h.ID, Labels: h.Labels, Simulated: h.Simulated, Accelerators: len(h.Devices) > 0,
			CPUs: CPUCount(h), NUMA: []NUMA{}, Devices: []Device{}, NICs: []NIC{}, Links: []Link{}}
		for _, n := range h.NUMA {
			hj.NUMA = append(hj.NUMA, NUMA{ID: n.ID, CPUs: n.CPUs, MemoryBytes: n.MemoryBytes, Distances: n.Distances})
		}
		for _, d := range h.Devices {
			dj := Device{ID: topology.Endpoint{Host: h.ID, Device: d.Index}.String(), Index: d.Index, Kind: string(d.Kind),
				Vendor: d.Vendor, Model: d.Model, MemoryBytes: d.MemoryBytes, NUMA: d.NUMA, BusID: d.BusID, PCIeSwitch: d.PCIeSwitch}
			if nics := h.NearestNICs(d.Index); len(nics) > 0 {
				dj.NearestNIC = nics[0].RDMADevice
				dj.NICPath = h.NICPath(d.Index, nics[0].Name).String()
			}
			hj.Devices = append(hj.Devices, dj)
		}
		for _, n := range h.NICs {
			hj.NICs = append(hj.NICs, NIC{Name: n.Name, RDMADevice: n.RDMADevice, SpeedGbps: n.SpeedGbps, NUMA: n.NUMA,
				BusID: n.BusID, LinkLayer: n.LinkLayer, State: n.State})
		}
		for _, l := range h.Links {
			hj.Links = append(hj.Links, Link{A: topology.Endpoint{Host: h.ID, Device: l.A}.String(),
				B: topology.Endpoint{Host: h.ID, Device: l.B}.String(), Kind: string(l.Kind), Lanes: l.Lanes, GBps: l.GBps})
		}
		v.Hosts = append(v.Hosts, hj)
	}
	for _, d := range c.Domains() {
		v.Domains = append(v.Domains, Domain{Kind: string(d.Kind), Name: d.Name, Link: string(d.Link), Hosts: d.Hosts, Devices: d.DeviceIDs()})
	}
	for _, w := range src.Warnings {
		v.Warnings = append(v.Warnings, w.String())
	}
	return v
}

// CPUCount is the number of CPUs h's NUMA nodes list.
func CPUCount(h *topology.Host) int {
	n := 0
	for _, node := range h.NUMA {
		cpus, err := topology.ParseCPUList(node.CPUs)
		if err == nil {
			n += len(cpus)
		}
	}
	return n
}

// ---- tree ----

// Tree writes c as a tree (topo's default): the cluster's domains, the
// first host's NUMA nodes, PCIe switches, devices and NICs, its device
// links, and the warnings of src.
func Tree(w io.Writer, c *topology.Cluster, src *Source) {
	if len(c.Hosts) > 1 {
		fmt.Fprintf(w, "cluster %s: %d hosts (%s)\n", c.Name, len(c.Hosts), src.Kind)
		writeDomains(w, c)
		fmt.Fprintln(w)
	}
	for i, h := range c.Hosts {
		if i > 0 {
			fmt.Fprintf(w, "\n(%d more hosts like %s; --host NAME shows one)\n", len(c.Hosts)-1, h.Preset)
			break
		}
		writeHostTree(w, c, h, src)
	}
	if len(src.Warnings) > 0 {
		fmt.Fprintf(w, "\n%d warning(s):\n", len(src.Warnings))
		for _, wn := range src.Warnings {
			fmt.Fprintf(w, "  %s\n", wn)
		}
	}
}

func writeDomains(w io.Writer, c *topology.Cluster) {
	ds := c.Domains()
	if len(ds) == 0 {
		return
	}
	fmt.Fprintln(w, "domains:")
	const maxShown = 12
	for i, d := range ds {
		if i == maxShown {
			fmt.Fprintf(w, "  ... %d more (--json lists all)\n", len(ds)-maxShown)
			break
		}
		link := ""
		if d.Link != "" {
			link = " over " + string(d.Link)
		}
		fmt.Fprintf(w, "  %-10s %-14s %d host(s), %d device(s)%s\n", d.Kind, d.Name, len(d.Hosts), len(d.Devices), link)
	}
}

type treeNode struct {
	label    string
	children []*treeNode
}

func writeHostTree(w io.Writer, c *topology.Cluster, h *topology.Host, src *Source) {
	kind := src.Kind
	if h.Simulated {
		kind = "simulated, preset " + h.Preset
	}
	fmt.Fprintf(w, "host %s (%s): %d CPUs, %d NUMA node(s), %d device(s), %d NIC(s)\n",
		h.ID, kind, CPUCount(h), len(h.NUMA), len(h.Devices), len(h.NICs))
	if len(h.Labels) > 0 {
		keys := make([]string, 0, len(h.Labels))
		for k := range h.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  label %s=%s\n", k, h.Labels[k])
		}
	}
	if len(h.Devices) == 0 {
		fmt.Fprintln(w, "  no accelerator found: showing CPUs, NUMA nodes and NICs")
	}
	// switches by parent
	children := map[string][]topology.PCIeSwitch{}
	for _, s := range h.Switches {
		children[s.Parent] = append(children[s.Parent], s)
	}
	devsUnder := map[string][]topology.Device{}
	for _, d := range h.Devices {
		devsUnder[d.PCIeSwitch] = append(devsUnder[d.PCIeSwitch], d)
	}
	nicsUnder := map[string][]topology.NIC{}
	for _, n := range h.NICs {
		nicsUnder[n.PCIeSwitch] = append(nicsUnder[n.PCIeSwitch], n)
	}
	numaIDs := map[int]bool{}
	for _, node := range h.NUMA {
		numaIDs[node.ID] = true
	}
	bucket := func(numa int) int {
		if numaIDs[numa] {
			return numa
		}
		return -1
	}
	// build returns the subtree of s holding the endpoints of one NUMA
	// bucket, nil when there are none: a root complex that spans nodes
	// shows under each, with that node's endpoints.
	var build func(s topology.PCIeSwitch, b int) *treeNode
	build = func(s topology.PCIeSwitch, b int) *treeNode {
		label := "switch " + s.ID
		switch {
		case s.HostBridge:
			label = "root complex " + s.ID
		case s.Parent == "" || isRootPort(h, s):
			label = "root port " + s.ID
		}
		if s.Vendor != "" && !s.HostBridge {
			label += " (" + s.Vendor + ")"
		}
		n := &treeNode{label: label}
		for _, d := range devsUnder[s.ID] {
			if bucket(d.NUMA) == b {
				n.children = append(n.children, &treeNode{label: deviceLabel(d)})
			}
		}
		for _, nic := range nicsUnder[s.ID] {
			if bucket(nic.NUMA) == b {
				n.children = append(n.children, &treeNode{label: nicLabel(nic)})
			}
		}
		empty := len(devsUnder[s.ID]) == 0 && len(nicsUnder[s.ID]) == 0
		for _, ch := range children[s.ID] {
			if c := build(ch, b); c != nil {
				n.children = append(n.children, c)
			}
			empty = false
		}
		if len(n.children) == 0 && !(empty && bucket(s.NUMA) == b) {
			return nil
		}
		return n
	}
	fill := func(r *treeNode, b int) {
		for _, s := range children[""] {
			if c := build(s, b); c != nil {
				r.children = append(r.children, c)
			}
		}
		for _, d := range devsUnder[""] {
			if bucket(d.NUMA) == b {
				r.children = append(r.children, &treeNode{label: deviceLabel(d)})
			}
		}
		for _, n := range nicsUnder[""] {
			if bucket(n.NUMA) == b {
				r.children = append(r.children, &treeNode{label: nicLabel(n)})
			}
		}
	}
	var roots []*treeNode
	for _, node := range h.NUMA {
		label := fmt.Sprintf("NUMA %d: CPUs %s", node.ID, orDash(node.CPUs))
		if node.MemoryBytes > 0 {
			label += ", " + MemorySize(node.MemoryBytes)
		}
		if len(node.Distances) > 1 {
			label += fmt.Sprintf(", distances %v", node.Distances)
		}
		r := &treeNode{label: label}
		fill(r, node.ID)
		roots = append(roots, r)
	}
	other := &treeNode{label: "no NUMA affinity"}
	fill(other, -1)
	if len(other.children) > 0 {
		roots = append(roots, other)
	}
	for i, r := range roots {
		printTree(w, r, "", i == len(roots)-1)
	}
	if s := linkSummary(h); s != "" {
		fmt.Fprintln(w, s)
	}
	if len(c.Hosts) == 1 {
		writeDomains(w, c)
	}
}

func isRootPort(h *topology.Host, s topology.PCIeSwitch) bool {
	p, ok := h.Switch(s.Parent)
	return ok && p.HostBridge
}

func printTree(w io.Writer, n *treeNode, prefix string, last bool) {
	branch, next := "├─ ", "│  "
	if last {
		branch, next = "└─ ", "   "
	}
	fmt.Fprintf(w, "%s%s%s\n", prefix, branch, n.label)
	for i, ch := range n.children {
		printTree(w, ch, prefix+next, i == len(n.children)-1)
	}
}

func deviceLabel(d topology.Device) string {
	s := fmt.Sprintf("%s%d %s %s", strings.ToUpper(string(d.Kind)), d.Index, d.Vendor, d.Model)
	if d.MemoryBytes > 0 {
		s += " " + MemorySize(d.MemoryBytes)
	}
	if d.BusID != "" {
		s += " " + d.BusID
	}
	if d.PCIe != nil && d.PCIe.Width > 0 {
		s += fmt.Sprintf(" PCIe Gen%d x%d", d.PCIe.Gen(), d.PCIe.Width)
	}
	if d.DevNode != "" {
		s += " " + d.DevNode
	}
	return s
}

func nicLabel(n topology.NIC) string {
	s := "NIC " + n.Name
	if n.RDMADevice != "" && n.RDMADevice != n.Name {
		s += " (" + n.RDMADevice + ")"
	}
	if n.SpeedGbps > 0 {
		s += fmt.Sprintf(" %g Gb/s", n.SpeedGbps)
	}
	switch {
	case n.RDMA() && n.LinkLayer != "":
		s += " RDMA/" + n.LinkLayer
	case n.RDMA():
		s += " RDMA"
	}
	if n.State != "" {
		s += " " + n.State
	}
	if n.BusID != "" {
		s += " " + n.BusID
	}
	if n.Driver != "" {
		s += " [" + n.Driver + "]"
	}
	return s
}

// linkSummary describes the device links compactly: all-to-all groups in
// one line, the rest counted by kind.
func linkSummary(h *topology.Host) string {
	if len(h.Links) == 0 {
		if len(h.Devices) > 1 {
			return "device links: none (devices talk over PCIe)"
		}
		return ""
	}
	type key struct {
		kind  topology.LinkKind
		lanes int
		gbps  float64
	}
	count := map[key]int{}
	var order []key
	for _, l := range h.Links {
		k := key{l.Kind, l.Lanes, l.GBps}
		if count[k] == 0 {
			order = append(order, k)
		}
		count[k]++
	}
	var parts []string
	for _, k := range order {
		label := topology.Path{Class: topology.PathNV, Link: k.kind, Lanes: k.lanes}.String()
		n := len(h.Devices)
		shape := fmt.Sprintf("%d links", count[k])
		if count[k] == n*(n-1)/2 && n > 1 {
			shape = fmt.Sprintf("all-to-all among %d devices", n)
		}
		parts = append(parts, fmt.Sprintf("%s (%s, %g GB/s each way): %s", label, k.kind, k.gbps, shape))
	}
	return "device links: " + strings.Join(parts, "; ")
}

// MemorySize writes a memory size as the tree shows it: "80 GiB", "7.5 GiB".
func MemorySize(b int64) string {
	const gibi = 1 << 30
	if b%gibi == 0 || b >= 100*gibi {
		return fmt.Sprintf("%d GiB", (b+gibi/2)/gibi)
	}
	return fmt.Sprintf("%.1f GiB", float64(b)/gibi)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ---- matrix ----

// Matrix writes the path matrix between h's devices and NICs, in the
// style of nvidia-smi topo -m, with a legend.
func Matrix(w io.Writer, c *topology.Cluster, h *topology.Host) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	var cols []string
	for _, d := range h.Devices {
		cols = append(cols, fmt.Sprintf("%s%d", matrixPrefix(d.Kind), d.Index))
	}
	var nics []topology.NIC
	for _, n := range h.NICs {
		if n.RDMA() {
			nics = append(nics, n)
		}
	}
	if len(nics) == 0 {
		nics = h.NICs
	}
	for i := range nics {
		cols = append(cols, fmt.Sprintf("NIC%d", i))
	}
	fmt.Fprintf(tw, "\t%s\tCPU Affinity\tNUMA Affinity\t\n", strings.Join(cols, "\t"))
	numaCPUs := map[int]string{}
	for _, n := range h.NUMA {
		numaCPUs[n.ID] = n.CPUs
	}
	for _, d := range h.Devices {
		cells := []string{}
		for _, e := range h.Devices {
			p := c.PathBetween(topology.Endpoint{Host: h.ID, Device: d.Index}, topology.Endpoint{Host: h.ID, Device: e.Index})
			cell := p.String()
			if cell == "SELF" {
				cell = " X "
			}
			cells = append(cells, cell)
		}
		for _, n := range nics {
			cells = append(cells, h.NICPath(d.Index, n.Name).String())
		}
		numa := "N/A"
		if d.NUMA >= 0 {
			numa = fmt.Sprint(d.NUMA)
		}
		fmt.Fprintf(tw, "%s%d\t%s\t%s\t%s\t\n", matrixPrefix(d.Kind), d.Index, strings.Join(cells, "\t"), orDash(numaCPUs[d.NUMA]), numa)
	}
	for i, n := range nics {
		cells := []string{}
		for _, d := range h.Devices {
			cells = append(cells, h.NICPath(d.Index, n.Name).String())
		}
		for j, m := range nics {
			if i == j {
				cells = append(cells, " X ")
				continue
			}
			cells = append(cells, nicNICPath(h, n, m).String())
		}
		fmt.Fprintf(tw, "NIC%d\t%s\t\t\t\n", i, strings.Join(cells, "\t"))
	}
	tw.Flush()
	fmt.Fprintln(w, "\nLegend:")
	fmt.Fprintln(w, "  X    = Self")
	fmt.Fprintln(w, "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes")
	fmt.Fprintln(w, "  NODE = Connection traversing PCIe as well as the interconnect between PCIe host bridges within a NUMA node")
	fmt.Fprintln(w, "  PHB  = Connection traversing PCIe as well as a PCIe host bridge (typically the CPU)")
	fmt.Fprintln(w, "  PXB  = Connection traversing multiple PCIe switches (without traversing the PCIe host bridge)")
	fmt.Fprintln(w, "  PIX  = Connection traversing at most a single PCIe switch")
	fmt.Fprintln(w, "  NV#  = Connection traversing a bonded set of # NVLinks (XGMI, ICI, NL, ROCE#: other device links)")
	if len(nics) > 0 {
		fmt.Fprintln(w, "\nNIC Legend:")
		for i, n := range nics {
			name := n.Name
			if n.RDMADevice != "" {
				name = n.RDMADevice
			}
			fmt.Fprintf(w, "  NIC%d: %s\n", i, name)
		}
	}
}

func matrixPrefix(k topology.DeviceKind) string {
	switch k {
	case topology.KindGPU:
		return "GPU"
	case topology.KindTPU:
		return "TPU"
	case topology.KindNeuron:
		return "NRN"
	case topology.KindHPU:
		return "HPU"
	}
	return "DEV"
}

// nicNICPath classifies two NICs by PCIe placement, through a device-less
// host: the library classifies device pairs and device-NIC pairs.
func nicNICPath(h *topology.Host, a, b topology.NIC) topology.Path {
	tmp := &topology.Host{ID: h.ID, NUMA: h.NUMA, Switches: h.Switches,
		Devices: []topology.Device{{Index: 0, NUMA: a.NUMA, PCIeSwitch: a.PCIeSwitch}}, NICs: []topology.NIC{b}}
	return tmp.NICPath(0, b.Name)
}

// ---- dot ----

// DotQuote makes a Graphviz quoted string: quotes and backslashes escaped,
// newlines as Graphviz's \n line break (Go's %q would double the
// backslash and Graphviz would print a literal "\n").
func DotQuote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}

// Dot writes c as a Graphviz graph: hosts, NUMA nodes, PCIe switches,
// devices, NICs and device links.
func Dot(w io.Writer, c *topology.Cluster) error {
	var b strings.Builder
	q := DotQuote
	fmt.Fprintf(&b, "graph %s {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n", q(c.Name))
	for hi, h := range c.Hosts {
		id := func(s string) string { return q(h.ID + "/" + s) }
		fmt.Fprintf(&b, "  subgraph cluster_%d {\n    label=%s;\n", hi, q(h.ID))
		for _, n := range h.NUMA {
			fmt.Fprintf(&b, "    %s [label=%s, shape=ellipse];\n", id(fmt.Sprintf("numa%d", n.ID)), q(fmt.Sprintf("NUMA %d\nCPUs %s", n.ID, n.CPUs)))
		}
		for _, s := range h.Switches {
			fmt.Fprintf(&b, "    %s [label=%s, shape=diamond];\n", id(s.ID), q(s.ID))
			parent := s.Parent
			if parent == "" {
				parent = fmt.Sprintf("numa%d", s.NUMA)
			}
			fmt.Fprintf(&b, "    %s -- %s;\n", id(parent), id(s.ID))
		}
		for _, d := range h.Devices {
			dn := id(fmt.Sprintf("dev%d", d.Index))
			fmt.Fprintf(&b, "    %s [label=%s, style=filled, fillcolor=\"#cde8c2\"];\n", dn, q(fmt.Sprintf("%s%d\n%s", matrixPrefix(d.Kind), d.Index, d.Model)))
			parent := d.PCIeSwitch
			if parent == "" {
				parent = fmt.Sprintf("numa%d", d.NUMA)
			}
			fmt.Fprintf(&b, "    %s -- %s;\n", id(parent), dn)
		}
		for _, n := range h.NICs {
			nn := id("nic-" + n.Name)
			fmt.Fprintf(&b, "    %s [label=%s, style=filled, fillcolor=\"#c2d8e8\"];\n", nn, q(fmt.Sprintf("%s\n%g Gb/s", n.Name, n.SpeedGbps)))
			parent := n.PCIeSwitch
			if parent == "" {
				parent = fmt.Sprintf("numa%d", n.NUMA)
			}
			fmt.Fprintf(&b, "    %s -- %s;\n", id(parent), nn)
		}
		for _, l := range h.Links {
			label := topology.Path{Class: topology.PathNV, Link: l.Kind, Lanes: l.Lanes}.String()
			fmt.Fprintf(&b, "    %s -- %s [label=%s, color=\"#76b900\", penwidth=2, constraint=false];\n",
				id(fmt.Sprintf("dev%d", l.A)), id(fmt.Sprintf("dev%d", l.B)), q(label))
		}
		b.WriteString("  }\n")
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}
