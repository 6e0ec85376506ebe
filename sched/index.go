package sched

import (
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

func newIndex(c *topology.Cluster, cost CostModel) *index {
	ix := &index{c: c, cost: cost, byID: make(map[string]int, len(c.Hosts))}
	for i, h := range c.Hosts {
		if h == nil {
			continue
		}
		ix.byID[h.ID] = i
		ix.hosts = append(ix.hosts, ix.hostInfo(h))
	}
	// Groups per level, in first-appearance order.
	for r := rankHost; r < numRanks; r++ {
		byName := map[string]int{}
		for hi := range ix.hosts {
			h := &ix.hosts[hi]
			name := "cluster"
			switch {
			case r == rankHost:
				name = h.id
			case r < rankCluster:
				if v := h.h.Labels[levelLabel[r]]; v != "" {
					name = "label:" + v
					ix.labelled[r] = true
				} else {
					name = "host:" + h.id
				}
			}
			g, ok := byName[name]
			if !ok {
				g = len(ix.groups[r])
				byName[name] = g
				ix.groups[r] = append(ix.groups[r], group{name: strings.TrimPrefix(strings.TrimPrefix(name, "label:"), "host:")})
			}
			ix.groups[r][g].hosts = append(ix.groups[r][g].hosts, hi)
			h.group[r] = g
		}
	}
	for r := rankNVLink; r < numRanks; r++ {
		ix.sameAsBelow[r] = samePartition(ix, r, r-1)
	}
	return ix
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
