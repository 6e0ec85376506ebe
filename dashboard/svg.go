package dashboard

import (
	"fmt"
	"html"
	"io"
	"sort"
	"strings"

	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// LinkColors colours links and domains by kind in the picture (and in the
// page's legend).
var LinkColors = map[string]string{
	string(topology.LinkNVLink):     "#76b900",
	string(topology.LinkXGMI):       "#e4002b",
	string(topology.LinkICI):        "#4285f4",
	string(topology.LinkNeuronLink): "#ff9900",
	string(topology.LinkRoCE):       "#0071c5",
	string(topology.LinkPCIe):       "#8a8f98",
	string(topology.LinkUPI):        "#b07cc6",
	"net":                           "#3b4a5a",
}

// Layout constants of the picture, in SVG user units.
const (
	colW    = 128 // one leaf column: a PCIe switch and what hangs below it
	rowH    = 46  // one tier of the PCIe tree
	boxH    = 34
	pad     = 12
	hostGap = 28
	headerH = 40
	busH    = 34 // device-link bus under the devices
)

// node is one box of a host's PCIe tree: a NUMA node, a switch, a device or
// a NIC, with the boxes below it.
type node struct {
	kind     string // numa, switch, device, nic
	label    string
	sub      string
	ep       string // "h0/gpu:3" for devices and host memory, as transfers name them
	children []*node
	dev      *topology.Device
	nic      *topology.NIC
	// filled by layout
	x, y, w int
}

// leafCol reports whether the node is drawn as one column: its devices and
// NICs stacked under it.
func (n *node) leafCol() bool {
	for _, c := range n.children {
		if c.kind == "switch" || c.kind == "numa" {
			return false
		}
	}
	return true
}

func (n *node) width() int {
	if n.kind == "device" || n.kind == "nic" {
		return colW
	}
	if n.leafCol() {
		return colW
	}
	w := 0
	for _, c := range n.children {
		w += c.width()
	}
	return max(w, colW)
}

// depth is the number of tiers the node's box and everything below it take.
func (n *node) depth() int {
	if n.kind == "device" || n.kind == "nic" {
		return 1
	}
	if n.leafCol() {
		return 1 + len(n.children)
	}
	d := 0
	for _, c := range n.children {
		d = max(d, c.depth())
	}
	return 1 + d
}

func (n *node) place(x, y int) {
	n.x, n.y, n.w = x, y, n.width()
	if n.leafCol() {
		for i, c := range n.children {
			c.place(x, y+(i+1)*rowH)
		}
		return
	}
	cx := x
	for _, c := range n.children {
		c.place(cx, y+rowH)
		cx += c.width()
	}
}

// hostTree builds the PCIe tree of a host: NUMA nodes at the top, then
// root ports and switches, devices and NICs under the switch they sit on.
func hostTree(h *topology.Host) []*node {
	sw := map[string]*node{}
	for _, s := range h.Switches {
		sub := ""
		if s.Vendor != "" {
			sub = s.Vendor
		}
		if s.HostBridge {
			sub = "root complex"
		}
		sw[s.ID] = &node{kind: "switch", label: s.ID, sub: sub}
	}
	numa := map[int]*node{}
	var roots []*node
	for i, n := range h.NUMA {
		ep := ""
		if i == 0 {
			ep = h.ID + "/" + tensor.HostDevice.String()
		}
		nn := &node{kind: "numa", label: fmt.Sprintf("NUMA %d", n.ID), sub: cpuSummary(n), ep: ep}
		numa[n.ID] = nn
		roots = append(roots, nn)
	}
	numaOf := func(id int) *node {
		if n, ok := numa[id]; ok {
			return n
		}
		n := &node{kind: "numa", label: fmt.Sprintf("NUMA %d", id)}
		numa[id] = n
		roots = append(roots, n)
		return n
	}
	for _, s := range h.Switches {
		parent := numaOf(s.NUMA)
		if p, ok := sw[s.Parent]; ok && s.Parent != "" {
			parent = p
		}
		parent.children = append(parent.children, sw[s.ID])
	}
	for i := range h.Devices {
		d := &h.Devices[i]
		n := &node{kind: "device", dev: d, label: fmt.Sprintf("%s%d", strings.ToUpper(string(d.Kind)), d.Index),
			sub: d.Model, ep: fmt.Sprintf("%s/%s:%d", h.ID, d.Kind, d.Index)}
		parent := numaOf(d.NUMA)
		if p, ok := sw[d.PCIeSwitch]; ok {
			parent = p
		}
		parent.children = append(parent.children, n)
	}
	for i := range h.NICs {
		c := &h.NICs[i]
		sub := fmt.Sprintf("%g Gb/s", c.SpeedGbps)
		if c.RDMA() {
			sub += " RDMA " + c.RDMADevice
		}
		n := &node{kind: "nic", nic: c, label: c.Name, sub: sub}
		parent := numaOf(c.NUMA)
		if p, ok := sw[c.PCIeSwitch]; ok {
			parent = p
		}
		parent.children = append(parent.children, n)
	}
	// Devices before NICs in a column, so device links line up.
	var order func(n *node)
	order = func(n *node) {
		sort.SliceStable(n.children, func(i, j int) bool { return rank(n.children[i]) < rank(n.children[j]) })
		for _, c := range n.children {
			order(c)
		}
	}
	for _, r := range roots {
		order(r)
	}
	return roots
}

func rank(n *node) int {
	switch n.kind {
	case "switch":
		return 0
	case "device":
		return 1
	}
	return 2
}

func cpuSummary(n topology.NUMANode) string {
	s := "cpus " + n.CPUs
	if len(s) > 22 {
		s = s[:21] + "…"
	}
	return s
}

// memUse is what the picture shows of a device's memory.
type memUse struct {
	used, capacity int64
	backend        string // tensor/backend's name of the memory: "sim", "cuda", "hip"
}

// writeSVG draws the cluster: one box per host (grouped into dashed rack
// boxes), its PCIe tree, devices with their memory in use, device-link
// buses coloured by kind, and the network the NICs join.
func writeSVG(w io.Writer, c *topology.Cluster, mem map[string]memUse) {
	type hostPic struct {
		h     *topology.Host
		roots []*node
		w, h2 int
	}
	var pics []hostPic
	maxW := 600
	for _, h := range c.Hosts {
		if h == nil {
			continue
		}
		roots := hostTree(h)
		wsum, depth := 0, 0
		for _, r := range roots {
			wsum += r.width()
			depth = max(depth, r.depth())
		}
		busesH := 0
		for _, g := range linkGroups(h) {
			busesH += g.height()
		}
		hp := hostPic{h: h, roots: roots, w: wsum + 2*pad, h2: headerH + depth*rowH + busesH + pad + 16}
		maxW = max(maxW, hp.w)
		pics = append(pics, hp)
	}
	netX := maxW + 3*pad + 150 // the network spine, right of the hosts, past the NIC summary
	totalW := netX + 120
	y := pad
	type rackBox struct {
		name   string
		y0, y1 int
	}
	var racks []rackBox
	var body strings.Builder
	for _, p := range pics {
		rack := p.h.Labels[topology.LabelRack]
		if rack != "" {
			if len(racks) == 0 || racks[len(racks)-1].name != rack {
				if len(racks) > 0 {
					y += hostGap
				}
				y += 18
				racks = append(racks, rackBox{name: rack, y0: y - 18})
			}
		}
		x0 := 2 * pad
		drawHost(&body, p.h, p.roots, x0, y, maxW, p.h2, mem, netX)
		y += p.h2
		if rack != "" {
			racks[len(racks)-1].y1 = y + 6
		}
		y += hostGap
	}
	totalH := y + pad
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" id="topology" viewBox="0 0 %d %d" width="%d" height="%d" font-family="sans-serif" font-size="11">`, totalW, totalH, totalW, totalH)
	fmt.Fprintf(w, `<title>%s</title>`, html.EscapeString(c.Name))
	for _, r := range racks {
		fmt.Fprintf(w, `<g class="rack" data-rack="%s"><rect x="%d" y="%d" width="%d" height="%d" rx="10" fill="none" stroke="#9aa5b1" stroke-dasharray="6 4"/>`+
			`<text x="%d" y="%d" fill="#52606d" font-weight="bold">rack %s</text></g>`,
			esc(r.name), pad, r.y0, maxW+2*pad, r.y1-r.y0, pad+8, r.y0+13, esc(r.name))
	}
	// The network the NICs join.
	fmt.Fprintf(w, `<g class="network"><rect x="%d" y="%d" width="14" height="%d" rx="4" fill="%s"/><text x="%d" y="%d" fill="%s" font-weight="bold">network</text></g>`,
		netX, pad, totalH-2*pad, LinkColors["net"], netX+20, pad+12, LinkColors["net"])
	io.WriteString(w, body.String())
	io.WriteString(w, `</svg>`)
}

// linkGroup is a set of device links drawn as one bus: all-to-all within a
// kind (an NVSwitch board), or individual links.
type linkGroup struct {
	kind     topology.LinkKind
	devices  []int
	complete bool
	lanes    int
	gbps     float64
	links    []topology.Link
}

// height is the band a group takes under the PCIe tree: a bus, or arcs.
func (g linkGroup) height() int {
	if g.complete {
		return busH
	}
	return busH + arcDip
}

// arcDip is the most an arc between two devices bends below its band.
const arcDip = 36

func linkGroups(h *topology.Host) []linkGroup {
	byKind := map[topology.LinkKind][]topology.Link{}
	var kinds []topology.LinkKind
	for _, l := range h.Links {
		if _, ok := byKind[l.Kind]; !ok {
			kinds = append(kinds, l.Kind)
		}
		byKind[l.Kind] = append(byKind[l.Kind], l)
	}
	var out []linkGroup
	for _, k := range kinds {
		ls := byKind[k]
		devs := map[int]bool{}
		pairs := map[[2]int]bool{}
		for _, l := range ls {
			devs[l.A], devs[l.B] = true, true
			pairs[[2]int{min(l.A, l.B), max(l.A, l.B)}] = true
		}
		g := linkGroup{kind: k, links: ls, lanes: ls[0].Lanes, gbps: ls[0].GBps}
		for d := range devs {
			g.devices = append(g.devices, d)
		}
		sort.Ints(g.devices)
		n := len(g.devices)
		g.complete = n > 2 && len(pairs) == n*(n-1)/2
		out = append(out, g)
	}
	return out
}

func esc(s string) string { return html.EscapeString(s) }

func drawHost(b *strings.Builder, h *topology.Host, roots []*node, x0, y0, w, hh int, mem map[string]memUse, netX int) {
	sim := ""
	if h.Simulated {
		sim = " · SIMULATED"
	}
	title := h.ID
	if h.Preset != "" {
		title += " · " + h.Preset
	}
	var labels []string
	for _, k := range []string{topology.LabelNVLinkDomain, topology.LabelSlice, topology.LabelBlock, topology.LabelZone} {
		if v := h.Labels[k]; v != "" {
			labels = append(labels, k[strings.LastIndex(k, "/")+1:]+" "+v)
		}
	}
	fmt.Fprintf(b, `<g class="host" data-host="%s" data-simulated="%v">`, esc(h.ID), h.Simulated)
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" rx="8" fill="#f7f9fb" stroke="#52606d"/>`, x0, y0, w, hh)
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="14" font-weight="bold" fill="#1f2933">%s<tspan fill="#c0392b">%s</tspan></text>`, x0+pad, y0+20, esc(title), sim)
	if len(labels) > 0 {
		fmt.Fprintf(b, `<text x="%d" y="%d" fill="#52606d">%s</text>`, x0+pad+260, y0+20, esc(strings.Join(labels, " · ")))
	}
	// Host to network: one line from the host's right edge per host, with
	// the NIC count and speed.
	var nics, rdma int
	var gbps float64
	for _, n := range h.NICs {
		nics++
		gbps += n.SpeedGbps
		if n.RDMA() {
			rdma++
		}
	}
	if nics > 0 {
		ly := y0 + hh - 14
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`, x0+w, ly, netX, ly, LinkColors["net"])
		fmt.Fprintf(b, `<text x="%d" y="%d" fill="%s">%d NICs · %g Gb/s · %d RDMA</text>`, x0+w+6, ly-5, LinkColors["net"], nics, gbps, rdma)
	}

	cx := x0 + pad
	devPos := map[int][2]int{} // device index -> bottom centre of its drop line
	hostB := b
	var boxes strings.Builder
	b = &boxes
	var draw func(n *node)
	draw = func(n *node) {
		if n.kind != "numa" {
			// PCIe edge from the parent tier.
			fmt.Fprintf(b, `<line class="pcie" x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s"/>`, n.x+colW/2, n.y, n.x+colW/2, n.y-(rowH-boxH), LinkColors["pcie"])
		}
		bw := n.w - 8
		if n.kind == "device" || n.kind == "nic" {
			bw = colW - 8
		}
		bx, by := n.x+4, n.y
		switch n.kind {
		case "numa":
			fmt.Fprintf(b, `<g class="numa" data-ep="%s"><rect x="%d" y="%d" width="%d" height="%d" rx="5" fill="#e4e7eb" stroke="#7b8794"/>`, esc(n.ep), bx, by, bw, boxH)
		case "switch":
			fmt.Fprintf(b, `<g class="switch"><rect x="%d" y="%d" width="%d" height="%d" rx="4" fill="#ffffff" stroke="%s"/>`, bx, by, bw, boxH, LinkColors["pcie"])
		case "nic":
			fmt.Fprintf(b, `<g class="nic" data-nic="%s"><rect x="%d" y="%d" width="%d" height="%d" rx="4" fill="#e8f0fe" stroke="%s"/>`, esc(n.label), bx, by, bw, boxH, LinkColors["net"])
		case "device":
			d := n.dev
			cls := "device " + string(d.Kind)
			if h.Simulated {
				cls += " simulated"
			}
			backend := ""
			if m, ok := mem[n.ep]; ok {
				backend = m.backend
			}
			fmt.Fprintf(b, `<g class="%s" data-ep="%s" data-model="%s" data-backend="%s"><rect x="%d" y="%d" width="%d" height="%d" rx="4" fill="#fffbea" stroke="#1f2933" stroke-width="1.5"/>`,
				cls, esc(n.ep), esc(d.Model), esc(backend), bx, by, bw, boxH)
			// Devices stacked in one column get drop lines side by side.
			devPos[d.Index] = [2]int{bx + bw/2 + ((by/rowH)%3-1)*14, by + boxH}
			if m, ok := mem[n.ep]; ok && m.capacity > 0 {
				frac := float64(m.used) / float64(m.capacity)
				fw := int(frac * float64(bw-8))
				if m.used > 0 {
					fw = max(fw, 1)
				}
				fmt.Fprintf(b, `<rect class="mem" x="%d" y="%d" width="%d" height="4" fill="#e4e7eb"/><rect x="%d" y="%d" width="%d" height="4" fill="#f0b429"><title>%s of %s in use (%s memory)</title></rect>`,
					bx+4, by+boxH-7, bw-8, bx+4, by+boxH-7, fw, human(m.used), human(m.capacity), esc(m.backend))
			}
		}
		fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">%s</text>`, bx+5, by+13, esc(n.label))
		if n.sub != "" {
			sub := n.sub
			if len(sub) > 22 {
				sub = sub[:21] + "…"
			}
			fmt.Fprintf(b, `<text x="%d" y="%d" fill="#52606d" font-size="9">%s</text>`, bx+5, by+24, esc(sub))
		}
		b.WriteString(`</g>`)
		for _, c := range n.children {
			draw(c)
		}
	}
	for _, r := range roots {
		r.place(cx, y0+headerH)
		cx += r.width()
		draw(r)
	}
	// Links first, so the boxes drawn over them hide the drop lines.
	b = hostB
	defer func() { b.WriteString(boxes.String()); b.WriteString(`</g>`) }()
	// Device-link buses, one per kind, under the PCIe tree.
	depth := 0
	for _, r := range roots {
		depth = max(depth, r.depth())
	}
	busY := y0 + headerH + depth*rowH + 6
	for _, g := range linkGroups(h) {
		col := LinkColors[string(g.kind)]
		if col == "" {
			col = "#333"
		}
		fmt.Fprintf(b, `<g class="link %s" data-kind="%s">`, esc(string(g.kind)), esc(string(g.kind)))
		if g.complete {
			x1, x2 := 1<<30, 0
			for _, d := range g.devices {
				p := devPos[d]
				x1, x2 = min(x1, p[0]), max(x2, p[0])
				fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2" opacity="0.8"/>`, p[0], p[1], p[0], busY, col)
			}
			fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="8" rx="4" fill="%s"/>`, x1-4, busY, x2-x1+8, col)
			lanes := ""
			if g.lanes > 0 {
				lanes = fmt.Sprintf(" NV%d", g.lanes)
				if g.kind != topology.LinkNVLink {
					lanes = fmt.Sprintf(" ×%d", g.lanes)
				}
			}
			fmt.Fprintf(b, `<text x="%d" y="%d" fill="%s" font-weight="bold">%s%s · %g GB/s · all-to-all, %d devices (%d links)</text>`,
				x1, busY+21, col, esc(string(g.kind)), lanes, g.gbps, len(g.devices), len(g.links))
		} else {
			for _, d := range g.devices {
				p := devPos[d]
				fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="1.5" opacity="0.8"/>`, p[0], p[1], p[0], busY, col)
			}
			for _, l := range g.links {
				a, c := devPos[l.A], devPos[l.B]
				dip := min(2*arcDip, 8+abs(a[0]-c[0])/12)
				fmt.Fprintf(b, `<path d="M%d %d Q%d %d %d %d" fill="none" stroke="%s" stroke-width="2" opacity="0.85"><title>%s %d-%d %g GB/s</title></path>`,
					a[0], busY, (a[0]+c[0])/2, busY+dip, c[0], busY, col, esc(string(l.Kind)), l.A, l.B, l.GBps)
			}
			fmt.Fprintf(b, `<text x="%d" y="%d" fill="%s" font-weight="bold">%s · %g GB/s · %d links</text>`, x0+pad, busY+arcDip+21, col, esc(string(g.kind)), g.gbps, len(g.links))
		}
		b.WriteString(`</g>`)
		busY += g.height()
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// human formats a byte count with a binary unit.
func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
