package fabricsim

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Spec describes what the topology does not: the network between the
// hosts, the efficiency of each path, and the fixed costs of a message.
// Its zero value means the defaults given per field, which are what this
// project measured or what the hardware's data sheets say (docs/sim.md
// lists the sources).
type Spec struct {
	// HostsPerLeaf is how many hosts share one leaf switch per rail (a
	// rail-optimized fabric: NIC k of every host of a leaf group plugs
	// into leaf k of the group). 0 means 32 (a 64-port leaf, half down).
	HostsPerLeaf int
	// Oversubscription is a leaf's downlink over its uplink bandwidth:
	// 1 is non-blocking, 2 halves what can leave a leaf. 0 means 1.
	Oversubscription float64
	// RDMAEfficiency is the share of a NIC's line rate that rdma payload
	// gets (headers, 4 KiB MTU): 0 means 0.97.
	RDMAEfficiency float64
	// TCPEfficiency is the share of line rate that tcp payload gets:
	// 0 means 0.93.
	TCPEfficiency float64
	// PCIeGBps is a device's PCIe bandwidth each way when the topology
	// gives none (Gen5 x16 after protocol overhead): 0 means 53.
	PCIeGBps float64
	// SwitchUplinkGBps is a PCIe switch's link to its root port each way,
	// crossed by traffic between a device and a NIC under another switch:
	// 0 means 64.
	SwitchUplinkGBps float64
	// MemcpyGBps is one host's copy bandwidth for shm and for copies
	// between simulated devices: 0 means 20.
	MemcpyGBps float64
	// Latency is the one-way latency of a network message (NIC to NIC):
	// 0 means 5 µs. ControlRTT is a control round trip between runtimes
	// (claim, resolve, a broadcast chunk's notice): 0 means 60 µs, the
	// p50 of a 4 KiB Get here (docs/benchmarks.md) less its bytes.
	Latency, ControlRTT float64
	// ProcessPerHost puts every device of a host in one runtime (one
	// `tensorlane worker` per host, as the multihost harness runs);
	// otherwise each device has its own process, as a GPU fleet runs.
	ProcessPerHost bool
	// Arenas says the devices are simulated memory arenas (the multihost
	// harness's workers): a device's bus is a memcpy, not PCIe.
	Arenas bool
	// Down lists NICs ("host/nic") that carry nothing: a cut rail.
	Down []string
	// Burst makes every NIC's links token buckets of that many bytes, as
	// tc's tbf shapes the harness's veths: a link idle for a while sends
	// up to Burst bytes at once, so short gaps between a connection's
	// writes cost no link time. 0: plain links.
	Burst float64
	// QueueSeconds is how much of a link's rate its FIFO holds when
	// control messages share it with data (on the harness's veths, what
	// TCP fills of tbf's queue: HarnessQueueSeconds): a broadcast
	// chunk's notice waits behind the chunks its edge already wrote, up
	// to that long. 0: control does not queue behind data (its own queue
	// pair or priority).
	QueueSeconds float64
	// RailTimeout is how long a rail with slices outstanding may make no
	// progress before the transport declares it broken and moves its
	// slices to the other rails (fabric/rdma's QPTimeout): 0 means 10 s.
	RailTimeout float64
	// CPU is what moving bytes costs the hosts' processors when every
	// host runs on one machine's cores (the multihost harness: four
	// namespaces, one worker each, on this machine's CPUs). The zero
	// value leaves processors out: a fleet's hosts have cores enough for
	// their NICs.
	CPU CPU
}

// CPU is the processor side of a run, in CPU-seconds as a calibration
// measured them (Calibration, `tensorlane sim calibrate`), never fitted
// to the cases it is checked against. Cores are shared by every host;
// whatever runs at once shares them max-min fairly, as the kernel's
// scheduler shares runnable threads.
type CPU struct {
	// Cores is how many cores the hosts share; 0 leaves processors out.
	Cores float64
	// ByteSeconds is the CPU time per byte a transfer between two hosts
	// costs both ends together (socket copies, framing, completion).
	ByteSeconds float64
	// ChunkSeconds is the CPU time of one broadcast chunk on one edge
	// between processes, beyond its bytes: the write's claim and
	// completion, its notice, the relay's bookkeeping. It runs after the
	// chunk lands and before its notice goes out.
	ChunkSeconds float64
	// LocalChunkSeconds and LocalByteSeconds are the same for an edge
	// inside one process (a host's leader feeding the next reader of its
	// runtime, ProcessPerHost): the relay's copy between two arenas, per
	// chunk and per byte, and a notice that is a function call, not a
	// message. 0: such an edge costs no CPU (its copy still takes the
	// host's memcpy link).
	LocalChunkSeconds, LocalByteSeconds float64
	// VerifySeconds is the CPU time per byte a reader spends on the
	// bytes of a Get after they land (the harness checks every byte
	// against its pattern; a library user's reader may not).
	VerifySeconds float64
	// Handoff is, per transport ("rdma", "tcp"), what a broadcast edge
	// between two processes waits each time its window runs out (nil or
	// a transport missing: nothing).
	Handoff map[string]Handoff
}

// Handoff is what a broadcast edge between two processes waits each time
// its window runs out: the edge's threads went idle, and every hop of the
// next chunk (its resolve, its bytes, its notice and the answer) wakes a
// process. It is charged only where the plan stalls (a window that never
// empties keeps the processes runnable), and only with shared cores and a
// process per host.
type Handoff struct {
	// StallSeconds is that wait on free cores, beyond what the model
	// already has (round trips, the chunk's CPU work).
	StallSeconds float64 `json:"stall_seconds"`
	// HandoffSeconds is added per process of the run beyond the cores:
	// each woken process waits its turn for a core behind the others.
	HandoffSeconds float64 `json:"handoff_seconds"`
}

func (s Spec) withDefaults() Spec {
	def := func(v *float64, d float64) {
		if *v <= 0 {
			*v = d
		}
	}
	if s.HostsPerLeaf <= 0 {
		s.HostsPerLeaf = 32
	}
	def(&s.Oversubscription, 1)
	def(&s.RDMAEfficiency, 0.97)
	def(&s.TCPEfficiency, 0.93)
	def(&s.PCIeGBps, 53)
	def(&s.SwitchUplinkGBps, 64)
	def(&s.MemcpyGBps, 20)
	def(&s.Latency, 5e-6)
	def(&s.ControlRTT, 60e-6)
	def(&s.RailTimeout, 10)
	return s
}

// Fabric is a cluster's links, built once from its topology and a Spec,
// and the planner that picks each transfer's path: fabric.Planner's own
// BestAllowed, the choice a runtime that runs every transport makes. Each
// workload method runs on a fresh event loop over the same links; a
// Fabric runs one workload at a time and is not safe for concurrent use.
type Fabric struct {
	c       *topology.Cluster
	spec    Spec
	sim     *engine
	planner *fabric.Planner
	hosts   map[string]*hostLinks
	order   []string // host IDs in cluster order
	// cpu is the shared cores' link (-1 without Spec.CPU.Cores), in
	// carried network bytes per second; cpuUnit is the CPU-seconds one
	// of its bytes stands for.
	cpu     int
	cpuUnit float64
	// base is the links as built; every run starts from them (a run may
	// cut one).
	base []link
}

type hostLinks struct {
	h       *topology.Host
	pos     int
	dev     map[int]*devLinks
	nics    []nicLinks // in h.NICs order
	memcpy  int
	uplink  map[string][2]int // PCIe switch -> (up, down)
	hasRDMA bool
}

type devLinks struct {
	pcieUp, pcieDown int
	nvOut, nvIn      int // -1 without device links
	sw               string
}

type nicLinks struct {
	nic      topology.NIC
	out, in  int
	rail     int // index among the host's NICs
	down     bool
	line     float64 // bytes/s at line rate
	leafUp   int
	leafDown int
}

// New builds the fabric of cluster c. It fails with ErrBadSpec for an
// empty cluster or a negative field.
func New(c *topology.Cluster, spec Spec) (*Fabric, error) {
	if c == nil || len(c.Hosts) == 0 {
		return nil, fmt.Errorf("%w: no hosts", ErrBadSpec)
	}
	if spec.HostsPerLeaf < 0 || spec.Oversubscription < 0 || spec.RDMAEfficiency > 1 || spec.TCPEfficiency > 1 || spec.Burst < 0 {
		return nil, fmt.Errorf("%w: negative size or efficiency above 1", ErrBadSpec)
	}
	if cpu := spec.CPU; cpu.Cores < 0 || cpu.ByteSeconds < 0 || cpu.ChunkSeconds < 0 || cpu.LocalChunkSeconds < 0 || cpu.LocalByteSeconds < 0 || cpu.VerifySeconds < 0 || negativeHandoff(cpu.Handoff) || (cpu.Cores > 0 && cpu.ByteSeconds == 0) {
		return nil, fmt.Errorf("%w: CPU costs must not be negative, and shared cores need a per-byte cost", ErrBadSpec)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSpec, err)
	}
	spec = spec.withDefaults()
	pl, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: c})
	if err != nil {
		return nil, err
	}
	f := &Fabric{c: c, spec: spec, sim: newSim(), planner: pl, hosts: map[string]*hostLinks{}, cpu: -1}
	if spec.CPU.Cores > 0 {
		// A network flow carries its payload over the path's efficiency;
		// the link counts carried bytes, so one of them costs the
		// payload's CPU time times the efficiency (rdma's: the harness
		// gives tcp the same).
		f.cpuUnit = spec.CPU.ByteSeconds * spec.RDMAEfficiency
		f.cpu = f.sim.addLink("cpu", spec.CPU.Cores/f.cpuUnit)
	}
	down := map[string]bool{}
	for _, d := range spec.Down {
		down[d] = true
	}
	gb := func(x float64) float64 { return x * 1e9 }
	// Leaf uplinks per (leaf group, rail): what can leave the leaf.
	type leafKey struct{ group, rail int }
	leafUp, leafDown := map[leafKey]int{}, map[leafKey]int{}
	leafLine := map[leafKey]float64{}
	for i, h := range c.Hosts {
		for k, n := range h.NICs {
			leafLine[leafKey{i / spec.HostsPerLeaf, k}] += nicLine(n)
		}
	}
	for key, line := range leafLine {
		name := fmt.Sprintf("leaf%d/rail%d", key.group, key.rail)
		leafUp[key] = f.sim.addLink(name+" up", line/spec.Oversubscription)
		leafDown[key] = f.sim.addLink(name+" down", line/spec.Oversubscription)
	}
	for i, h := range c.Hosts {
		hl := &hostLinks{h: h, pos: i, dev: map[int]*devLinks{}, uplink: map[string][2]int{}}
		hl.memcpy = f.sim.addLink(h.ID+" memcpy", gb(spec.MemcpyGBps))
		for _, sw := range h.Switches {
			hl.uplink[sw.ID] = [2]int{
				f.sim.addLink(h.ID+"/"+sw.ID+" uplink up", gb(spec.SwitchUplinkGBps)),
				f.sim.addLink(h.ID+"/"+sw.ID+" uplink down", gb(spec.SwitchUplinkGBps)),
			}
		}
		for _, d := range h.Devices {
			pcie := spec.PCIeGBps
			if spec.Arenas {
				pcie = spec.MemcpyGBps // a memory arena: copies, not a bus
			}
			if d.PCIe != nil && d.PCIe.GTps > 0 && d.PCIe.Width > 0 {
				// 128b/130b coding and about 15% protocol overhead.
				pcie = d.PCIe.GTps * float64(d.PCIe.Width) / 8 * 128 / 130 * 0.85
				if spec.Arenas {
					pcie = spec.MemcpyGBps
				}
			}
			dl := &devLinks{sw: d.PCIeSwitch, nvOut: -1, nvIn: -1}
			name := h.ID + "/" + strconv.Itoa(d.Index)
			dl.pcieUp = f.sim.addLink(name+" pcie up", gb(pcie))
			dl.pcieDown = f.sim.addLink(name+" pcie down", gb(pcie))
			nv := 0.0
			for _, l := range h.Links {
				if (l.A == d.Index || l.B == d.Index) && l.Kind.IsDeviceLink() {
					nv = max(nv, l.GBps) // switched fabrics give each pair the GPU's total
				}
			}
			if nv > 0 {
				dl.nvOut = f.sim.addLink(name+" nvlink out", gb(nv))
				dl.nvIn = f.sim.addLink(name+" nvlink in", gb(nv))
			}
			hl.dev[d.Index] = dl
		}
		for k, n := range h.NICs {
			line := nicLine(n)
			nl := nicLinks{nic: n, rail: k, line: line, down: down[h.ID+"/"+n.Name]}
			nl.out = f.sim.addLink(h.ID+"/"+n.Name+" out", line)
			nl.in = f.sim.addLink(h.ID+"/"+n.Name+" in", line)
			f.sim.links[nl.out].shaped, f.sim.links[nl.in].shaped = spec.Burst > 0, spec.Burst > 0
			key := leafKey{i / spec.HostsPerLeaf, k}
			nl.leafUp, nl.leafDown = leafUp[key], leafDown[key]
			hl.nics = append(hl.nics, nl)
			if n.RDMA() {
				hl.hasRDMA = true
			}
		}
		f.hosts[h.ID] = hl
		f.order = append(f.order, h.ID)
	}
	f.base = slices.Clone(f.sim.links)
	return f, nil
}

func negativeHandoff(h map[string]Handoff) bool {
	for _, x := range h {
		if x.StallSeconds < 0 || x.HandoffSeconds < 0 {
			return true
		}
	}
	return false
}

// unknownNICGbps is the line rate of a NIC whose speed the topology does
// not know (discovery of a link that is down reports 0): a common
// datacenter port rather than a link that carries nothing.
const unknownNICGbps = 100

// nicLine is a NIC's line rate in bytes/s.
func nicLine(n topology.NIC) float64 {
	g := n.SpeedGbps
	if g <= 0 {
		g = unknownNICGbps
	}
	return g / 8 * 1e9
}

// Endpoint is a device of a host (Device -1: host memory).
type Endpoint = topology.Endpoint

// fabricEndpoint is the planner's view of e: its process per the Spec.
func (f *Fabric) fabricEndpoint(e Endpoint) fabric.Endpoint {
	dev := tensor.HostDevice
	if e.Device != topology.HostMemory {
		kind := tensor.GPU
		if h, ok := f.hosts[e.Host]; ok {
			if d, ok := h.h.Device(e.Device); ok {
				kind = tensor.DeviceKind(d.Kind)
			}
		}
		dev = tensor.DeviceID{Kind: kind, Index: e.Device}
	}
	proc := e.Host
	if !f.spec.ProcessPerHost {
		proc = e.Host + "/" + dev.String()
	}
	return fabric.Endpoint{Process: proc, Host: e.Host, Device: dev}
}

// Route is the path a transfer from src to dst takes: the transport the
// planner picks and the links of each of its flows.
type Route struct {
	Transport string
	Path      topology.Path
	flows     [][]int
	// Efficiency is the payload share of the links' rate on this path.
	Efficiency float64
	// Setup is the fixed cost before the first byte moves: the claim and
	// resolve round trips of a read.
	Setup float64
}

// Route plans a transfer from src to dst as a runtime would.
func (f *Fabric) Route(src, dst Endpoint) (Route, error) {
	hs, ok1 := f.hosts[src.Host]
	hd, ok2 := f.hosts[dst.Host]
	if !ok1 || !ok2 {
		return Route{}, fmt.Errorf("%w: %v -> %v", ErrUnknownEndpoint, src, dst)
	}
	ds, ds2 := hs.dev[src.Device], hd.dev[dst.Device]
	if (src.Device != topology.HostMemory && ds == nil) || (dst.Device != topology.HostMemory && ds2 == nil) {
		return Route{}, fmt.Errorf("%w: %v -> %v", ErrUnknownEndpoint, src, dst)
	}
	se, de := f.fabricEndpoint(src), f.fabricEndpoint(dst)
	best, path := f.planner.BestAllowed(se, de)
	r := Route{Transport: best, Path: path, Efficiency: 1, Setup: f.spec.ControlRTT}
	up := func(d *devLinks, h *hostLinks) int {
		if d == nil {
			return h.memcpy
		}
		return d.pcieUp
	}
	downL := func(d *devLinks, h *hostLinks) int {
		if d == nil {
			return h.memcpy
		}
		return d.pcieDown
	}
	switch best {
	case fabric.Local:
		if src.Device == dst.Device {
			r.Setup = 0
			return r, nil // a view: nothing moves
		}
		r.flows = [][]int{{hs.memcpy}}
	case fabric.P2P:
		switch {
		case ds != nil && ds2 != nil && ds.nvOut >= 0 && ds2.nvIn >= 0 && path.Class == topology.PathNV:
			r.flows = [][]int{{ds.nvOut, ds2.nvIn}}
		case path.Class == topology.PathMNNVL && ds != nil && ds2 != nil && ds.nvOut >= 0 && ds2.nvIn >= 0:
			r.flows = [][]int{{ds.nvOut, ds2.nvIn}}
		default:
			r.flows = [][]int{{up(ds, hs), downL(ds2, hd)}}
		}
	case fabric.SHM:
		r.flows = [][]int{{up(ds, hs), hs.memcpy, downL(ds2, hd)}}
	case fabric.RDMA:
		r.Efficiency = f.spec.RDMAEfficiency
		r.Setup = 2 * f.spec.ControlRTT // claim, then resolve on a rail
		r.flows = f.railFlows(hs, ds, src.Device, hd, ds2, dst.Device, true)
	default: // tcp
		r.Efficiency = f.spec.TCPEfficiency
		r.flows = f.railFlows(hs, ds, src.Device, hd, ds2, dst.Device, false)
	}
	if f.cpu >= 0 && hs != hd {
		// Both ends' processors handle every byte between hosts.
		for i := range r.flows {
			r.flows[i] = append(r.flows[i], f.cpu)
		}
	}
	if len(r.flows) == 0 {
		return r, fmt.Errorf("%w: %v -> %v over %s: every NIC is down", ErrNoRoute, src, dst, best)
	}
	return r, nil
}

// railFlows is rdma's striping (fabric/rdma railsFor): one flow per NIC of
// the owner, nearest its device first, each paired with the reader's NIC
// of the same name or else the reader's NIC nearest the destination in
// turn. tcp uses the first pair only.
func (f *Fabric) railFlows(hs *hostLinks, ds *devLinks, sdev int, hd *hostLinks, dd *devLinks, ddev int, rdma bool) [][]int {
	order := func(h *hostLinks, dev int) []int {
		var out []int
		if dev != topology.HostMemory {
			for _, n := range h.h.NearestNICs(dev) {
				for k := range h.nics {
					if h.nics[k].nic.Name == n.Name {
						out = append(out, k)
					}
				}
			}
		}
		for k := range h.nics { // the rest (non-RDMA NICs, host memory)
			if !containsInt(out, k) && (!rdma || h.nics[k].nic.RDMA()) {
				out = append(out, k)
			}
		}
		return out
	}
	remote, local := order(hs, sdev), order(hd, ddev)
	var live []int
	for _, k := range local {
		if !hd.nics[k].down {
			live = append(live, k)
		}
	}
	if len(live) == 0 {
		return nil
	}
	var flows [][]int
	for i, rk := range remote {
		rn := hs.nics[rk]
		if rn.down {
			continue // a cut rail: the transport pauses it and stripes over the rest
		}
		lk := live[i%len(live)]
		for _, k := range live {
			if hd.nics[k].nic.Name == rn.nic.Name {
				lk = k
			}
		}
		ln := hd.nics[lk]
		var p []int
		if ds != nil {
			p = append(p, ds.pcieUp)
			if ds.sw != rn.nic.PCIeSwitch {
				p = append(p, f.crossSwitch(hs, ds.sw, rn.nic.PCIeSwitch)...)
			}
		} else {
			p = append(p, hs.memcpy)
		}
		p = append(p, rn.out)
		if hs != hd {
			if hs.pos/f.spec.HostsPerLeaf != hd.pos/f.spec.HostsPerLeaf || rn.rail != ln.rail {
				p = append(p, rn.leafUp, ln.leafDown)
			}
		}
		p = append(p, ln.in)
		if dd != nil {
			if dd.sw != ln.nic.PCIeSwitch {
				p = append(p, f.crossSwitchDown(hd, ln.nic.PCIeSwitch, dd.sw)...)
			}
			p = append(p, dd.pcieDown)
		} else {
			p = append(p, hd.memcpy)
		}
		flows = append(flows, p)
		if !rdma {
			break
		}
	}
	return flows
}

// crossSwitch is the path from a device under switch a to a NIC under
// switch b of one host: up a's uplink, down b's.
func (f *Fabric) crossSwitch(h *hostLinks, a, b string) []int {
	var p []int
	if u, ok := h.uplink[a]; ok {
		p = append(p, u[0])
	}
	if u, ok := h.uplink[b]; ok {
		p = append(p, u[1])
	}
	return p
}

func (f *Fabric) crossSwitchDown(h *hostLinks, nicSw, devSw string) []int {
	var p []int
	if u, ok := h.uplink[nicSw]; ok {
		p = append(p, u[0])
	}
	if u, ok := h.uplink[devSw]; ok {
		p = append(p, u[1])
	}
	return p
}

func containsInt(x []int, v int) bool {
	for _, y := range x {
		if y == v {
			return true
		}
	}
	return false
}

// startRoute begins moving n bytes along r after its setup; done runs at
// the end. Efficiency stretches the bytes (what the links carry is
// payload over efficiency).
func (f *Fabric) startRoute(r Route, n float64, done func(*transfer)) {
	f.sim.after(r.Setup+f.spec.Latency, func() {
		f.sim.start(n/r.Efficiency, r.flows, done)
	})
}

// edgeRate is the payload rate of a transfer from src to dst alone on
// the fabric: per flow, its narrowest network link (the shared cores
// left out), summed over the flows.
func (f *Fabric) edgeRate(src, dst Endpoint) float64 {
	rt, err := f.Route(src, dst)
	if err != nil {
		return math.Inf(1)
	}
	sum := 0.0
	for _, p := range rt.flows {
		c := math.Inf(1)
		for _, l := range p {
			if l != f.cpu {
				c = min(c, f.sim.links[l].cap)
			}
		}
		sum += c
	}
	if sum == 0 {
		return math.Inf(1)
	}
	return sum * rt.Efficiency
}

// cpuWork runs sec CPU-seconds of work on the shared cores (a timer of
// sec when processors are left out), then done.
func (f *Fabric) cpuWork(sec float64, done func()) {
	switch {
	case sec <= 0:
		f.sim.after(0, done)
	case f.cpu < 0:
		f.sim.after(sec, done)
	default:
		f.sim.start(sec/f.cpuUnit, [][]int{{f.cpu}}, func(*transfer) { done() })
	}
}

// lineRate is the network line rate of a host in bytes/s (all its NICs
// that are up), math.Inf(1) for an unknown host.
func (f *Fabric) lineRate(host string) float64 {
	h, ok := f.hosts[host]
	if !ok {
		return math.Inf(1)
	}
	sum := 0.0
	for _, n := range h.nics {
		if !n.down {
			sum += n.line
		}
	}
	return sum
}
