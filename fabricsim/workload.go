package fabricsim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/topology"
)

// Result is one simulated workload: how long it took, and next to it the
// line-rate bound, the bytes that must cross the narrowest cut over that
// cut's aggregate line rate, which no plan can beat.
type Result struct {
	Workload string  `json:"workload"`
	Seconds  float64 `json:"seconds"`
	Bytes    float64 `json:"bytes"` // payload delivered
	// BoundSeconds is the line-rate bound and BoundCut the cut that sets
	// it ("h3 ingress", "leaf0 uplinks"); RatioToBound is Seconds over it.
	BoundSeconds float64 `json:"bound_seconds"`
	BoundCut     string  `json:"bound_cut"`
	RatioToBound float64 `json:"ratio_to_bound"`
	// Transfers counts what the plan moved, by transport; Flows counts
	// the flows (a striped transfer has one per rail).
	Transfers map[string]int `json:"transfers"`
	Flows     int            `json:"flows"`
	// Busiest lists the links that carried the most, with their use (the
	// share of their capacity they carried over the run).
	Busiest []LinkUse `json:"busiest"`
	// Finish is when each reader (or inference GPU) had all its bytes,
	// in seconds, in the order of the workload's readers.
	Finish []float64 `json:"finish,omitempty"`
	// Binding is the busiest link of the run, Busiest's first; Note says
	// when it is not a NIC or leaf link, so that the line-rate bound
	// (which counts only those) is not what holds the plan back: a
	// broadcast from one GPU, whose every edge stripes over the host's
	// rails, is bound by that GPU's PCIe link.
	Binding string `json:"binding,omitempty"`
	Note    string `json:"note,omitempty"`
	// CPUSeconds is the CPU time the run's shared cores did (Spec.CPU;
	// 0 without), to check against what the processes measured.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
}

// LinkUse is one link's share of the run.
type LinkUse struct {
	Link string  `json:"link"`
	GB   float64 `json:"gb"`
	Use  float64 `json:"use"`
}

// run is one workload's bookkeeping on a fresh simulator.
type run struct {
	f         *Fabric
	transfers map[string]int
	flows     int
	egress    map[string]float64 // network bytes out of a host, for the bound
	ingress   map[string]float64
	groupOut  map[int]float64 // bytes leaving a leaf group
	groupIn   map[int]float64
	payload   float64
	err       error
}

func (f *Fabric) newRun() *run {
	// A fresh event loop over the same links.
	s := newSim()
	s.burst = f.spec.Burst
	s.links = make([]link, len(f.base))
	s.on = make([][]*flow, len(f.base))
	for i, l := range f.base {
		s.links[i] = link{name: l.name, cap: l.cap, shaped: l.shaped}
	}
	f.sim = s
	return &run{f: f, transfers: map[string]int{}, egress: map[string]float64{}, ingress: map[string]float64{},
		groupOut: map[int]float64{}, groupIn: map[int]float64{}}
}

// move plans and starts one transfer of n bytes from src to dst after
// extra seconds more than its route's setup; done runs at its end.
func (r *run) move(src, dst Endpoint, n float64, setup *float64, done func()) {
	rt, err := r.f.Route(src, dst)
	if err != nil {
		if r.err == nil {
			r.err = err
		}
		return
	}
	if setup != nil {
		rt.Setup = *setup
	}
	r.transfers[rt.Transport]++
	r.flows += len(rt.flows)
	if src.Host != dst.Host {
		r.egress[src.Host] += n
		r.ingress[dst.Host] += n
		ga := r.f.hosts[src.Host].pos / r.f.spec.HostsPerLeaf
		gb := r.f.hosts[dst.Host].pos / r.f.spec.HostsPerLeaf
		if ga != gb {
			r.groupOut[ga] += n
			r.groupIn[gb] += n
		}
	}
	r.f.startRoute(rt, n, func(*transfer) { done() })
}

func (r *run) finish(name string, payload float64, finish []float64) (Result, error) {
	if r.err != nil {
		return Result{}, r.err
	}
	if err := r.f.sim.run(); err != nil {
		return Result{}, err
	}
	if r.err != nil {
		return Result{}, r.err
	}
	s := r.f.sim
	res := Result{Workload: name, Seconds: s.now, Bytes: payload, Transfers: r.transfers, Flows: r.flows, Finish: finish}
	res.BoundSeconds, res.BoundCut = r.bound()
	if r.f.cpu >= 0 {
		res.CPUSeconds = s.links[r.f.cpu].bytes * r.f.cpuUnit
	}
	if res.BoundSeconds > 0 {
		res.RatioToBound = res.Seconds / res.BoundSeconds
	}
	for i, l := range s.links {
		if l.bytes <= 0 {
			continue
		}
		use := 0.0
		if s.now > 0 {
			use = l.bytes / (r.f.base[i].cap * s.now) // as built: a cut link's is 0 now
		}
		res.Busiest = append(res.Busiest, LinkUse{Link: l.name, GB: l.bytes / 1e9, Use: use})
	}
	slices.SortStableFunc(res.Busiest, func(a, b LinkUse) int { return cmp.Compare(b.Use, a.Use) })
	res.Busiest = res.Busiest[:min(len(res.Busiest), 8)]
	if len(res.Busiest) > 0 {
		b := res.Busiest[0]
		res.Binding = fmt.Sprintf("%s %.0f%%", b.Link, 100*b.Use)
		nic := (strings.HasSuffix(b.Link, " out") || strings.HasSuffix(b.Link, " in")) && !strings.Contains(b.Link, "nvlink")
		switch {
		case b.Use < 0.5:
			res.Note = fmt.Sprintf("no link busy half the run (the busiest, %s, %.0f%%): waits bind it (round trips, a cut rail's timeout)", b.Link, 100*b.Use)
		case !nic && !strings.HasPrefix(b.Link, "leaf"):
			res.Note = fmt.Sprintf("bound by %s (%.0f%% busy), which the line-rate bound does not count", b.Link, 100*b.Use)
		}
	}
	return res, nil
}

// bound is the line-rate bound of what this run had to move between
// hosts: per host, the bytes out and in over its NICs' line rate, and per
// leaf group, the bytes that cross it over its uplinks.
func (r *run) bound() (float64, string) {
	best, cut := 0.0, ""
	consider := func(bytes, rate float64, name string) {
		if bytes <= 0 || rate <= 0 || math.IsInf(rate, 1) {
			return
		}
		if t := bytes / rate; t > best {
			best, cut = t, name
		}
	}
	full := func(h string) float64 {
		sum := 0.0
		for _, n := range r.f.hosts[h].nics {
			sum += n.line
		}
		return sum
	}
	groupLine := map[int]float64{}
	for _, h := range r.f.order {
		consider(r.egress[h], full(h), h+" egress")
		consider(r.ingress[h], full(h), h+" ingress")
		groupLine[r.f.hosts[h].pos/r.f.spec.HostsPerLeaf] += full(h)
	}
	// A leaf group's uplinks carry what its hosts exchange with other
	// groups: they are a cut too when oversubscribed.
	for g, line := range groupLine {
		up := line / r.f.spec.Oversubscription
		consider(r.groupOut[g], up, fmt.Sprintf("leaf group %d uplinks", g))
		consider(r.groupIn[g], up, fmt.Sprintf("leaf group %d downlinks", g))
	}
	return best, cut
}

// Transfer simulates one Get of n bytes from src into dst.
func (f *Fabric) Transfer(src, dst Endpoint, n int64) (Result, error) {
	if n < 0 {
		return Result{}, fmt.Errorf("%w: negative size %d", ErrBadSpec, n)
	}
	r := f.newRun()
	var end float64
	r.move(src, dst, float64(n), nil, func() {
		f.cpuWork(f.spec.CPU.VerifySeconds*float64(n), func() { end = f.sim.now })
	})
	res, err := r.finish("transfer", float64(n), nil)
	res.Finish = []float64{end}
	return res, err
}

// ManyToOne simulates every reader Getting the same n bytes from owner at
// once (no tree): the owner's links carry each copy.
func (f *Fabric) ManyToOne(owner Endpoint, readers []Endpoint, n int64) (Result, error) {
	if n < 0 || len(readers) == 0 {
		return Result{}, fmt.Errorf("%w: size %d, %d readers", ErrBadSpec, n, len(readers))
	}
	r := f.newRun()
	finish := make([]float64, len(readers))
	for i, d := range readers {
		r.move(owner, d, float64(n), nil, func() {
			f.cpuWork(f.spec.CPU.VerifySeconds*float64(n), func() { finish[i] = f.sim.now })
		})
	}
	return r.finish("many-to-one", float64(n)*float64(len(readers)), finish)
}

// Broadcast simulates rdt's Broadcast of n bytes from owner to readers:
// the tree rdt plans (rdt.PlanBroadcastTree, the planner Broadcast runs),
// the object cut into cfg's chunks, every edge keeping cfg's window of
// chunks in flight, each chunk forwarded as it lands, each push followed
// by its notice round trip.
func (f *Fabric) Broadcast(owner Endpoint, readers []Endpoint, n int64, cfg rdt.BroadcastConfig) (Result, error) {
	if n <= 0 || len(readers) == 0 {
		return Result{}, fmt.Errorf("%w: size %d, %d readers", ErrBadSpec, n, len(readers))
	}
	plan, err := rdt.PlanBroadcastTree(f.c, owner, readers)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrUnknownEndpoint, err)
	}
	cfg = cfg.Defaults()
	window := max(cfg.Window, 1)
	chunks := int((n + cfg.ChunkSize - 1) / cfg.ChunkSize)
	size := func(k int) float64 { return float64(min(cfg.ChunkSize, n-int64(k)*cfg.ChunkSize)) }
	r := f.newRun()
	rtt, lat := f.spec.ControlRTT, f.spec.Latency
	type node struct {
		ep       Endpoint
		has      []bool
		count    int
		children []int
		next     int // next chunk to push to this node
		inflight int // pushed and not yet answered (the window)
		// The edge's pushes ride one connection (a queue pair, a
		// stream): they move one after the other, not side by side.
		wireBusy bool
		queued   []int
		rdma     bool // the edge is an rdma write
		// transport is the edge's (the planner's choice).
		transport string
		// waking: the edge stalled, and its sender waits its turn for
		// a core before it pushes again, whatever else arrives.
		waking bool
	}
	nodes := make([]*node, len(readers))
	var rootKids []int
	for i, p := range plan.Nodes {
		nodes[i] = &node{ep: readers[i], has: make([]bool, chunks)}
		if p.Parent < 0 {
			rootKids = append(rootKids, i)
		}
	}
	for i, p := range plan.Nodes {
		if p.Parent >= 0 {
			nodes[p.Parent].children = append(nodes[p.Parent].children, i)
		}
	}
	for i, nd := range nodes {
		from := owner
		if p := plan.Nodes[i].Parent; p >= 0 {
			from = nodes[p].ep
		}
		if rt, err := f.Route(from, nd.ep); err == nil {
			nd.transport, nd.rdma = rt.Transport, rt.Transport == fabric.RDMA
		}
	}
	finish := make([]float64, len(readers))
	parentHas := func(i, k int) bool {
		if p := plan.Nodes[i].Parent; p >= 0 {
			return nodes[p].has[k]
		}
		return true
	}
	parentEp := func(i int) Endpoint {
		if p := plan.Nodes[i].Parent; p >= 0 {
			return nodes[p].ep
		}
		return owner
	}
	procs := map[string]bool{owner.Host: true}
	for _, e := range readers {
		procs[e.Host] = true
	}
	// What an edge between processes waits when its window runs out:
	// its transport's stall, and a hand-off per process of the run
	// beyond the shared cores (Spec.CPU.Handoff).
	stall := func(i int) float64 {
		c := f.spec.CPU
		h, ok := c.Handoff[nodes[i].transport]
		if c.Cores <= 0 || !f.spec.ProcessPerHost || !ok || parentEp(i).Host == nodes[i].ep.Host {
			return 0
		}
		return h.StallSeconds + h.HandoffSeconds*max(0, float64(len(procs))-c.Cores)
	}
	// The CPU work of chunk k on edge i: between processes, the
	// calibrated cost of a chunk (its bytes are on the cpu link); inside
	// one process (a leader feeding the next reader of its runtime), the
	// relay's copy and a notice that is a function call, which the
	// calibration measures apart (charging such an edge a message's cost
	// made 64 KiB chunks to 8 readers, five such edges of the eight,
	// 20-30% too slow).
	chunkCPU := func(i, k int) float64 {
		c, p := f.spec.CPU, parentEp(i)
		if p.Host == nodes[i].ep.Host && (f.spec.ProcessPerHost || p.Device == nodes[i].ep.Device) {
			return c.LocalChunkSeconds + c.LocalByteSeconds*size(k)
		}
		return c.ChunkSeconds
	}
	var push func(i int)
	var wire func(i int)
	// wire moves the edge's next queued chunk when its connection is free.
	wire = func(i int) {
		nd := nodes[i]
		if nd.wireBusy || len(nd.queued) == 0 {
			return
		}
		k := nd.queued[0]
		nd.queued = nd.queued[1:]
		nd.wireBusy = true
		setup := 0.0 // the edge's connection is up: a chunk costs its latency
		r.move(parentEp(i), nd.ep, size(k), &setup, func() {
			nd.wireBusy = false
			// Where control shares the data's queue (a shaped link's
			// FIFO), the notice goes out behind the chunks already
			// written on this edge, as much of them as the queue holds.
			ahead := 0.0
			if f.spec.QueueSeconds > 0 && parentEp(i).Host != nd.ep.Host {
				for _, q := range nd.queued {
					ahead += size(q)
				}
				ahead = min(ahead/f.edgeRate(parentEp(i), nd.ep), f.spec.QueueSeconds)
			}
			wire(i)
			// The chunk's own CPU work (completion, notice, the relay's
			// bookkeeping), then the notice reaches the reader half a
			// round trip later; the window slot frees when its answer
			// is back.
			f.cpuWork(chunkCPU(i, k), func() {
				rtt := rtt + 2*ahead
				f.sim.after(rtt/2, func() {
					nd.has[k] = true
					if nd.count++; nd.count == chunks {
						finish[i] = f.sim.now
					}
					for _, c := range nd.children {
						push(c)
					}
				})
				f.sim.after(rtt, func() {
					// A full window stalled the edge: the answer wakes
					// its sender for the next chunk, which waits its turn.
					stalled := nd.inflight == window
					nd.inflight--
					if wait := stall(i); stalled && wait > 0 {
						nd.waking = true
						f.sim.after(wait, func() {
							nd.waking = false
							push(i)
						})
						return
					}
					push(i)
				})
			})
		})
	}
	push = func(i int) {
		nd := nodes[i]
		if nd.waking {
			return
		}
		for nd.inflight < window && nd.next < chunks && parentHas(i, nd.next) {
			k := nd.next
			nd.next++
			nd.inflight++
			if nd.rdma {
				// The write's resolve round trip first (fabric/rdma
				// resolves every transfer, a push as much as a read),
				// beside the chunks already in the window.
				f.sim.after(rtt, func() {
					nd.queued = append(nd.queued, k)
					wire(i)
				})
				continue
			}
			nd.queued = append(nd.queued, k)
		}
		wire(i)
	}
	// Prepare: the owner tells every relay its children (one round trip,
	// in parallel), then feeds the first level.
	f.sim.after(rtt+lat, func() {
		for _, i := range rootKids {
			push(i)
		}
	})
	res, err := r.finish("broadcast", float64(n)*float64(len(readers)), finish)
	if err != nil {
		return res, err
	}
	// The bound of a broadcast: every host that reads gets the bytes once
	// and the owner's host sends them once (the tree's own edges may
	// cross a host more often; the bound does not).
	res.BoundSeconds, res.BoundCut = 0, ""
	hosts := map[string]bool{}
	for _, e := range readers {
		if e.Host != owner.Host {
			hosts[e.Host] = true
		}
	}
	if len(hosts) > 0 {
		res.BoundSeconds, res.BoundCut = float64(n)/f.lineRate(owner.Host), owner.Host+" egress"
		for _, h := range f.order {
			if hosts[h] {
				if t := float64(n) / f.lineRate(h); t > res.BoundSeconds {
					res.BoundSeconds, res.BoundCut = t, h+" ingress"
				}
			}
		}
		res.RatioToBound = res.Seconds / res.BoundSeconds
	}
	return res, nil
}

// WeightSync describes a weight sync: a model of Bytes, sharded evenly
// over the trainer GPUs in order (trainer i holds the i-th slice), to be
// delivered to inference GPUs grouped in replicas of ReplicaGPUs, each
// replica sharding the whole model evenly over its GPUs in order.
type WeightSync struct {
	Bytes       int64
	Trainers    []Endpoint
	Inference   []Endpoint
	ReplicaGPUs int
}

// WeightSync simulates tensorlane's plan for a weight sync: every
// inference GPU reads its shard's pieces from the trainers that hold them
// with one GetBatch, which holds the leases with one round trip per owner
// and fetches each owner's pieces as one coalesced read, all owners at
// once; every read takes the planner's path (rdma striped over every rail
// between two hosts).
func (f *Fabric) WeightSync(w WeightSync) (Result, error) {
	T, I, P := len(w.Trainers), len(w.Inference), w.ReplicaGPUs
	if w.Bytes <= 0 || T == 0 || I == 0 || P <= 0 || I%P != 0 {
		return Result{}, fmt.Errorf("%w: weight sync of %d bytes, %d trainers, %d inference GPUs in replicas of %d", ErrBadSpec, w.Bytes, T, I, P)
	}
	r := f.newRun()
	M := float64(w.Bytes)
	finish := make([]float64, I)
	for j, dst := range w.Inference {
		q := j % P
		lo, hi := M*float64(q)/float64(P), M*float64(q+1)/float64(P)
		pending := 0
		for t := range T {
			tlo, thi := M*float64(t)/float64(T), M*float64(t+1)/float64(T)
			piece := min(hi, thi) - max(lo, tlo)
			if piece <= 0 {
				continue
			}
			pending++
			setup := 3 * f.spec.ControlRTT // the batch's lease round trip, then claim and resolve
			r.move(w.Trainers[t], dst, piece, &setup, func() {
				if pending--; pending == 0 {
					finish[j] = f.sim.now
				}
			})
		}
	}
	return r.finish("weight-sync", M*float64(I/P), finish)
}

// Hosts returns the IDs of the fabric's hosts in cluster order.
func (f *Fabric) Hosts() []string { return slices.Clone(f.order) }

// GPUs lists the devices of the given hosts, host by host, as endpoints.
func (f *Fabric) GPUs(hosts []string) []Endpoint {
	var out []Endpoint
	for _, id := range hosts {
		if h, ok := f.hosts[id]; ok {
			for _, d := range h.h.Devices {
				out = append(out, topology.Endpoint{Host: id, Device: d.Index})
			}
		}
	}
	return out
}
