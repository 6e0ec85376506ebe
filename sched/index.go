package sched

import (
	"slices"
	"strconv"
	"strings"

	"github.com/tensorlane/tensorlane/topology"
)

// index is a read-only, position-addressed view of a cluster built once per
// Scheduler: hosts and devices by position, groups per level, the path
// class and bandwidth of every device pair of a host, and each device's
// network attachment.
type index struct {
	c      *topology.Cluster
	cost   CostModel
	hosts  []hostInfo
	byID   map[string]int
	groups [numRanks][]group // rankHost..rankCluster; rankNUMA is per host
	// sameAsBelow[r] is true when level r partitions the hosts exactly as
	// the next lower level does (climbing to it gains nothing).
	sameAsBelow [numRanks]bool
	labelled    [numRanks]bool // some host carries the level's label
	shapes      int            // distinct host shapes (hostInfo.shape)
	// labelledRanks lists the levels from NVLink to zone that are
	// labelled, the ones the anti-fragmentation order looks at.
	labelledRanks []int
	// shapeOf and lgroup repeat hostInfo.shape and the groups of the
	// labelled ranks in compact arrays: run.candidates reads them for
	// every host of the fleet for every bundle, and hostInfo is large.
	shapeOf []int32
	lgroup  [][]int32 // per labelledRanks entry, per host
}

// maxShapeCompare bounds how many known shapes a new host is compared
// with; a host matching none of them gets a shape of its own (correct,
// only not shared).
const maxShapeCompare = 8

// sameShape reports whether two hosts have the same hardware as far as
// hostInfo reads it: NUMA nodes, PCIe switches, devices, NICs, device
// links and the PCIe peer-to-peer label. IDs and the other labels may
// differ.
func sameShape(a, b *topology.Host) bool {
	if len(a.NUMA) != len(b.NUMA) || len(a.Devices) != len(b.Devices) ||
		!slices.Equal(a.Switches, b.Switches) || !slices.Equal(a.NICs, b.NICs) || !slices.Equal(a.Links, b.Links) ||
		a.Labels[topology.LabelPCIeP2P] != b.Labels[topology.LabelPCIeP2P] {
		return false
	}
	for i := range a.NUMA {
		x, y := a.NUMA[i], b.NUMA[i]
		if x.ID != y.ID || x.CPUs != y.CPUs || x.MemoryBytes != y.MemoryBytes || !slices.Equal(x.Distances, y.Distances) {
			return false
		}
	}
	for i := range a.Devices {
		x, y := a.Devices[i], b.Devices[i]
		px, py := x.PCIe, y.PCIe
		x.PCIe, y.PCIe = nil, nil
		if x != y || (px == nil) != (py == nil) || (px != nil && *px != *py) {
			return false
		}
	}
	return true
}

type group struct {
	name  string
	hosts []int
}

type hostInfo struct {
	h        *topology.Host
	id       string
	devs     []devInfo
	pos      map[int]int // device index -> position
	numas    []int       // NUMA node IDs of the host's devices, ascending
	cpuMilli int64       // 0: not modelled (unlimited)
	memBytes int64       // 0: not modelled (unlimited)
	group    [numRanks]int
	pair     [][]pairInfo // between device positions
	nics     []float64    // usable GB/s per NIC (TCP derated)
	hostNIC  int          // NIC that host-memory endpoints use, -1 none
	hostNet  float64      // its GB/s
	// shape numbers the hosts whose hardware is the same (sameShape):
	// they share devs, pos, numas, pair and nics, which are read-only
	// once built, and a clean host of a shape serves a bundle exactly as
	// any other clean host of it does (run.candidates relies on that).
	shape int
}

type devInfo struct {
	index     int
	kind      topology.DeviceKind
	model     string
	mem       int64
	numa      int
	sw        string
	nicAffine bool    // an RDMA NIC sits under the same PCIe switch
	nic       int     // NIC used for NET transfers, -1 for the host's virtual NIC
	net       float64 // GB/s it gets over the network
}

type pairInfo struct {
	class topology.PathClass
	gbps  float64
}

func newIndex(c *topology.Cluster, cost CostModel, noShapes bool) *index {
	ix := &index{c: c, cost: cost, byID: make(map[string]int, len(c.Hosts))}
	// A fleet is a few host designs repeated thousands of times: the
	// per-host tables (nearest NIC of every device, every device pair's
	// path) are built once per design and shared, which is most of what
	// building a Scheduler for 100k GPUs used to cost in time and memory.
	var reps []int // position of each shape's first host
	ix.hosts = make([]hostInfo, 0, len(c.Hosts))
	for i, h := range c.Hosts {
		if h == nil {
			continue
		}
		ix.byID[h.ID] = i
		shape := -1
		// Hosts of one design usually come in runs: try the last shape
		// first, then a bounded number of others.
		for k := len(reps) - 1; !noShapes && k >= 0 && k >= len(reps)-maxShapeCompare; k-- {
			if sameShape(ix.hosts[reps[k]].h, h) {
				shape = k
				break
			}
		}
		if shape < 0 {
			hi := ix.hostInfo(h)
			hi.shape = len(reps)
			reps = append(reps, len(ix.hosts))
			ix.hosts = append(ix.hosts, hi)
			continue
		}
		hi := ix.hosts[reps[shape]]
		hi.h, hi.id = h, h.ID
		ix.hosts = append(ix.hosts, hi)
	}
	ix.shapes = len(reps)
	// Groups per level, in first-appearance order.
	// Groups per level, in first-appearance order, hosts in cluster
	// order. A group is named by its label value, or is the host alone
	// where the label is missing (host IDs are unique: Validate). Built
	// in two passes with one backing array per level, since at fleet
	// size the unlabelled levels have one group per host.
	gid := make([]int, len(ix.hosts))
	for r := rankHost; r < numRanks; r++ {
		byLabel := map[string]int{}
		n := 0
		for hi := range ix.hosts {
			h := &ix.hosts[hi]
			g := -1
			switch {
			case r == rankCluster:
				g, n = 0, 1
			case r > rankHost:
				if v := h.h.Labels[levelLabel[r]]; v != "" {
					ix.labelled[r] = true
					var ok bool
					if g, ok = byLabel[v]; !ok {
						g = n
						n++
						byLabel[v] = g
					}
				}
			}
			if g < 0 {
				g = n
				n++
			}
			gid[hi] = g
			h.group[r] = g
		}
		groups := make([]group, n)
		count := make([]int, n)
		for _, g := range gid {
			count[g]++
		}
		backing := make([]int, len(ix.hosts))
		off := 0
		for g := range groups {
			groups[g].hosts = backing[off : off : off+count[g]]
			off += count[g]
		}
		for hi, g := range gid {
			grp := &groups[g]
			if len(grp.hosts) == 0 {
				grp.name = groupName(r, ix.hosts[hi])
			}
			grp.hosts = append(grp.hosts, hi)
		}
		ix.groups[r] = groups
	}
	for l := rankNVLink; l <= rankZone; l++ {
		if ix.labelled[l] {
			ix.labelledRanks = append(ix.labelledRanks, l)
			g := make([]int32, len(ix.hosts))
			for h := range ix.hosts {
				g[h] = int32(ix.hosts[h].group[l])
			}
			ix.lgroup = append(ix.lgroup, g)
		}
	}
	ix.shapeOf = make([]int32, len(ix.hosts))
	for h := range ix.hosts {
		ix.shapeOf[h] = int32(ix.hosts[h].shape)
	}
	for r := rankNVLink; r < numRanks; r++ {
		ix.sameAsBelow[r] = samePartition(ix, r, r-1)
	}
	return ix
}

// groupName is the name of host h's group at level r, as it has always
// been shown.
func groupName(r int, h hostInfo) string {
	switch {
	case r == rankCluster:
		return "cluster"
	case r == rankHost:
		return strings.TrimPrefix(strings.TrimPrefix(h.id, "label:"), "host:")
	}
	if v := h.h.Labels[levelLabel[r]]; v != "" {
		return strings.TrimPrefix(v, "host:")
	}
	return h.id
}

func samePartition(ix *index, a, b int) bool {
	if len(ix.groups[a]) != len(ix.groups[b]) {
		return false
	}
	seen := map[[2]int]bool{}
	for hi := range ix.hosts {
		seen[[2]int{ix.hosts[hi].group[a], ix.hosts[hi].group[b]}] = true
	}
	return len(seen) == len(ix.groups[a])
}

func (ix *index) hostInfo(h *topology.Host) hostInfo {
	m := ix.cost
	hi := hostInfo{h: h, id: h.ID, pos: map[int]int{}, hostNIC: -1}
	for _, n := range h.NUMA {
		hi.cpuMilli += 1000 * int64(countCPUs(n.CPUs))
		hi.memBytes += n.MemoryBytes
	}
	// NICs: usable bandwidth, TCP derated.
	for _, n := range h.NICs {
		gbps := n.SpeedGbps / 8
		if n.RDMA() {
			gbps *= m.RDMAEfficiency
		} else {
			gbps *= m.TCPEfficiency
		}
		if gbps <= 0 {
			gbps = m.DefaultNICGbps / 8 * m.TCPEfficiency
		}
		hi.nics = append(hi.nics, gbps)
		if hi.hostNIC < 0 || gbps > hi.hostNet {
			hi.hostNIC, hi.hostNet = len(hi.nics)-1, gbps
		}
	}
	if hi.hostNIC < 0 {
		hi.hostNet = m.DefaultNICGbps / 8 * m.TCPEfficiency
	}
	nicPos := map[string]int{}
	for i, n := range h.NICs {
		if _, ok := nicPos[n.Name]; !ok {
			nicPos[n.Name] = i
		}
	}
	numaSeen := map[int]bool{}
	for _, d := range h.Devices {
		di := devInfo{index: d.Index, kind: d.Kind, model: d.Model, mem: d.MemoryBytes, numa: d.NUMA, sw: d.PCIeSwitch,
			nic: hi.hostNIC, net: hi.hostNet}
		for _, n := range h.NICs {
			if n.RDMA() && d.PCIeSwitch != "" && n.PCIeSwitch == d.PCIeSwitch {
				di.nicAffine = true
			}
		}
		if nics := h.NearestNICs(d.Index); len(nics) > 0 {
			n := nics[0]
			f := m.NICRemoteNUMA
			switch {
			case d.PCIeSwitch != "" && n.PCIeSwitch == d.PCIeSwitch:
				f = 1
			case n.NUMA == d.NUMA:
				f = m.NICSameNUMA
			}
			if p, ok := nicPos[n.Name]; ok && hi.nics[p] > 0 {
				di.nic, di.net = p, hi.nics[p]*f
			}
		}
		hi.pos[d.Index] = len(hi.devs)
		hi.devs = append(hi.devs, di)
		if !numaSeen[d.NUMA] {
			numaSeen[d.NUMA] = true
			hi.numas = append(hi.numas, d.NUMA)
		}
	}
	sortInts(hi.numas)
	// Same-host device pairs, classified by topology on a one-host cluster
	// (PathBetween looks hosts up by a linear scan).
	one := &topology.Cluster{Hosts: []*topology.Host{h}}
	n := len(hi.devs)
	hi.pair = make([][]pairInfo, n)
	for a := 0; a < n; a++ {
		hi.pair[a] = make([]pairInfo, n)
		for b := 0; b < n; b++ {
			if a == b {
				hi.pair[a][b] = pairInfo{class: topology.PathSELF}
				continue
			}
			p := one.PathBetween(topology.Endpoint{Host: h.ID, Device: hi.devs[a].index}, topology.Endpoint{Host: h.ID, Device: hi.devs[b].index})
			hi.pair[a][b] = pairInfo{class: p.Class, gbps: ix.classGBps(p.Class, p.GBps)}
		}
	}
	return hi
}

// classGBps is the cost model's bandwidth for a same-host path class.
func (ix *index) classGBps(c topology.PathClass, link float64) float64 {
	m := ix.cost
	switch c {
	case topology.PathNV:
		if link > 0 {
			return link
		}
		return m.NV
	case topology.PathPIX:
		return m.PIX
	case topology.PathPXB:
		return m.PXB
	case topology.PathPHB:
		return m.PHB
	case topology.PathNODE:
		return m.NODE
	case topology.PathMNNVL:
		return m.MNNVL
	}
	return m.SYS
}

// countCPUs counts the CPUs of a Linux cpulist ("0-55,112-167"); malformed
// parts count as nothing.
func countCPUs(list string) int {
	n := 0
	for _, part := range strings.Split(list, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, ok := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			continue
		}
		if !ok {
			n++
			continue
		}
		b, err := strconv.Atoi(hi)
		if err != nil || b < a || b-a > 1<<20 {
			continue
		}
		n += b - a + 1
	}
	return n
}

func sortInts(x []int) {
	for i := 1; i < len(x); i++ {
		for j := i; j > 0 && x[j] < x[j-1]; j-- {
			x[j], x[j-1] = x[j-1], x[j]
		}
	}
}

// usage is what is taken: devices held by reservations (and tentatively by
// the search), failed hosts and devices, CPUs and host memory.
type usage struct {
	used       [][]bool
	failedDev  [][]bool
	failedHost []bool
	cpuUsed    []int64
	memUsed    []int64
	// busy counts held or failed devices per group per level, for the
	// anti-fragmentation order.
	busy     [numRanks][]int
	hostBusy []int
}

func newUsage(ix *index) *usage {
	u := &usage{
		used: make([][]bool, len(ix.hosts)), failedDev: make([][]bool, len(ix.hosts)),
		failedHost: make([]bool, len(ix.hosts)), cpuUsed: make([]int64, len(ix.hosts)),
		memUsed: make([]int64, len(ix.hosts)), hostBusy: make([]int, len(ix.hosts)),
	}
	for i, h := range ix.hosts {
		u.used[i] = make([]bool, len(h.devs))
		u.failedDev[i] = make([]bool, len(h.devs))
	}
	for r := rankHost; r < numRanks; r++ {
		u.busy[r] = make([]int, len(ix.groups[r]))
	}
	return u
}

func (u *usage) available(h, d int) bool {
	return !u.used[h][d] && !u.failedDev[h][d] && !u.failedHost[h]
}

func (u *usage) markBusy(ix *index, h int, delta int) {
	u.hostBusy[h] += delta
	for r := rankHost; r < numRanks; r++ {
		u.busy[r][ix.hosts[h].group[r]] += delta
	}
}

// take and put hold or return one bundle's resources.
func (u *usage) take(ix *index, h int, devs []int, cpu, mem int64) {
	for _, d := range devs {
		if !u.failedDev[h][d] {
			u.markBusy(ix, h, 1)
		}
		u.used[h][d] = true
	}
	u.cpuUsed[h] += cpu
	u.memUsed[h] += mem
}

func (u *usage) put(ix *index, h int, devs []int, cpu, mem int64) {
	for _, d := range devs {
		u.used[h][d] = false
		if !u.failedDev[h][d] {
			u.markBusy(ix, h, -1)
		}
	}
	u.cpuUsed[h] -= cpu
	u.memUsed[h] -= mem
}

func (u *usage) failDevice(ix *index, h, d int) {
	if u.failedDev[h][d] {
		return
	}
	u.failedDev[h][d] = true
	if !u.used[h][d] {
		u.markBusy(ix, h, 1)
	}
}

func (u *usage) restoreDevice(ix *index, h, d int) {
	if !u.failedDev[h][d] {
		return
	}
	u.failedDev[h][d] = false
	if !u.used[h][d] {
		u.markBusy(ix, h, -1)
	}
}
