package sched

import "math"

// run is one greedy placement of the gang inside one scope, followed by a
// local improvement pass. It holds its tentative devices in the solver's
// usage and returns them when it ends.
type run struct {
	s       *solver
	sc      *scope
	a       []asg
	loads   map[resKey]float64
	maxLoad float64
	dirty   bool
	sum     float64
	gang    []int // bundles per host position (sparse use)
	gangH   []int // hosts holding gang bundles, first use first
	buf     []charge
	work    int // edges evaluated, bounds the local search
	agg     []charge
	// domHosts, when set, confines candidates to one domain (the
	// partition start); domMark marks its hosts.
	domHosts []int
	domMark  []bool
	shapeTop []shapeTop // per host shape, reused by candidates
}

// run places the gang in scope sc: the plain greedy, and where the scope
// spans several domains also the partition start (partition.go), each
// followed by the local search. The better result wins; ties go to the
// plain greedy.
func (s *solver) run(sc *scope) *result {
	res := s.runStart(sc, nil)
	if s.cfg.noPartition {
		return res
	}
	// Small gangs, where one instance's quality matters most and work is
	// cheap, try both linkages; large ones single linkage only.
	for _, total := range []bool{false, true} {
		if total && len(s.cr.bundles) > max(s.cfg.LocalSearch, 0) {
			break
		}
		if p := s.partition(sc, total); p != nil {
			if pr := s.runStart(sc, p); pr != nil && pr.better(res, false) {
				res = pr
			}
		}
	}
	return res
}

func (s *solver) runStart(sc *scope, p *partition) *result {
	n := len(s.cr.bundles)
	r := &run{s: s, sc: sc, a: make([]asg, n), loads: map[resKey]float64{}, gang: make([]int, len(s.ix.hosts))}
	for b := range r.a {
		r.a[b].host = -1
	}
	// Pinned bundles keep their devices (already held in the usage).
	for b, p := range s.pinned {
		if p.host >= 0 {
			r.place(b, p.host, p.devs, false)
		}
	}
	ok := true
	if p != nil {
		ok = r.placePartition(p)
	} else {
		for _, b := range s.order {
			h, devs := r.bestHost(b)
			if h < 0 {
				ok = false
				break
			}
			r.place(b, h, devs, true)
		}
	}
	defer func() { s.work += r.work }()
	var res *result
	if ok {
		r.improve()
		res = &result{a: make([]asg, n), numa: make([]int, n), cost: r.curMax(), sum: r.sum, order: sc.order, scopeKey: sc.name}
		if s.cr.strategy == Spread {
			res.shared = n - len(r.gangH)
		}
		for b, x := range r.a {
			res.a[b] = asg{host: x.host, devs: append([]int(nil), x.devs...)}
			res.numa[b] = s.ix.commonNUMA(x.host, x.devs)
		}
	}
	for b := range r.a {
		if r.a[b].host >= 0 && s.pinned[b].host < 0 {
			r.unplace(b, true)
		}
	}
	return res
}

func (ix *index) commonNUMA(h int, devs []int) int {
	if len(devs) == 0 {
		return -1
	}
	nu := ix.hosts[h].devs[devs[0]].numa
	for _, d := range devs[1:] {
		if ix.hosts[h].devs[d].numa != nu {
			return -1
		}
	}
	return nu
}

// place records bundle b on host h; hold says whether to take the
// resources from the usage (pinned bundles hold them already).
func (r *run) place(b, h int, devs []int, hold bool) {
	s := r.s
	if hold {
		bd := &s.cr.bundles[b]
		s.u.take(s.ix, h, devs, bd.cpuMilli, r.hostMem(b))
	}
	r.a[b] = asg{host: h, devs: devs}
	if r.gang[h] == 0 {
		r.gangH = append(r.gangH, h)
	}
	r.gang[h]++
	r.buf = r.charges(r.buf[:0], b, h, devs)
	for _, c := range r.buf {
		v := r.loads[c.key] + c.t
		r.loads[c.key] = v
		r.sum += c.t
		if !r.dirty && v > r.maxLoad {
			r.maxLoad = v
		}
	}
}

func (r *run) unplace(b int, hold bool) {
	s := r.s
	x := r.a[b]
	r.a[b] = asg{host: -1}
	if hold {
		bd := &s.cr.bundles[b]
		s.u.put(s.ix, x.host, x.devs, bd.cpuMilli, r.hostMem(b))
	}
	r.gang[x.host]--
	if r.gang[x.host] == 0 {
		for i, h := range r.gangH {
			if h == x.host {
				r.gangH = append(r.gangH[:i], r.gangH[i+1:]...)
				break
			}
		}
	}
	r.buf = r.charges(r.buf[:0], b, x.host, x.devs)
	for _, c := range r.buf {
		v := r.loads[c.key] - c.t
		if math.Abs(v) < 1e-12 {
			delete(r.loads, c.key)
		} else {
			r.loads[c.key] = v
		}
		r.sum -= c.t
	}
	r.dirty = true
}

func (r *run) hostMem(b int) int64 {
	bd := &r.s.cr.bundles[b]
	if bd.devices == 0 {
		return bd.memBytes
	}
	return 0
}

func (r *run) curMax() float64 {
	if r.dirty {
		r.maxLoad = 0
		for _, v := range r.loads {
			r.maxLoad = max(r.maxLoad, v)
		}
		r.dirty = false
	}
	return r.maxLoad
}

// charges appends the charges of every edge between bundle b (as if on h,
// devs) and the bundles placed already.
func (r *run) charges(out []charge, b, h int, devs []int) []charge {
	cr := r.s.cr
	r.work += len(cr.adj[b])
	for _, ei := range cr.adj[b] {
		e := cr.edges[ei]
		if e.from == b {
			o := r.a[e.to]
			if o.host < 0 {
				continue
			}
			out = r.s.ix.edgeCharges(out, h, devs, o.host, o.devs, e.gb)
		} else {
			o := r.a[e.from]
			if o.host < 0 {
				continue
			}
			out = r.s.ix.edgeCharges(out, o.host, o.devs, h, devs, e.gb)
		}
	}
	return out
}

// delta is the busiest resource and the added busy time if b went to h.
func (r *run) delta(b, h int, devs []int) (float64, float64) {
	r.buf = r.charges(r.buf[:0], b, h, devs)
	cur := r.curMax()
	if len(r.buf) == 0 {
		return cur, 0
	}
	// Sum charges per resource (few, so a linear merge).
	r.agg = r.agg[:0]
	sum := 0.0
	for _, c := range r.buf {
		sum += c.t
		found := false
		for i := range r.agg {
			if r.agg[i].key == c.key {
				r.agg[i].t += c.t
				found = true
				break
			}
		}
		if !found {
			r.agg = append(r.agg, c)
		}
		if len(r.agg) > 256 {
			break
		}
	}
	m := cur
	if len(r.agg) > 256 {
		tmp := map[resKey]float64{}
		for _, c := range r.buf {
			tmp[c.key] += c.t
		}
		for k, t := range tmp {
			m = max(m, r.loads[k]+t)
		}
		return m, sum
	}
	for _, c := range r.agg {
		m = max(m, r.loads[c.key]+c.t)
	}
	return m, sum
}

// hostFree checks host h for bundle b (scope, liveness, selector,
// strategy, CPUs, memory) and returns how many of its free devices could
// serve b, or -1.
func (r *run) hostFree(b, h int) int {
	s := r.s
	u := s.u
	if u.failedHost[h] || !r.sc.has(s.ix, h) || !s.selectorOK(b, h) {
		return -1
	}
	if s.cr.strategy == StrictSpread && r.gang[h] > 0 {
		return -1
	}
	hi := &s.ix.hosts[h]
	bd := &s.cr.bundles[b]
	if hi.cpuMilli > 0 && u.cpuUsed[h]+bd.cpuMilli > hi.cpuMilli {
		return -1
	}
	if m := r.hostMem(b); m > 0 && hi.memBytes > 0 && u.memUsed[h]+m > hi.memBytes {
		return -1
	}
	if bd.devices == 0 {
		return 0
	}
	n := 0
	for d := range hi.devs {
		if u.available(h, d) && s.devOK(b, h, d, r.sc.numa) {
			n++
		}
	}
	if n < bd.devices {
		return -1
	}
	return n
}

// fragKey ranks a host for the anti-fragmentation order (smaller first):
// per labelled level from zone down, 1 if the host's group is untouched;
// 1 if the host is untouched; then the devices left free.
func (r *run) fragKey(h, left int) [numRanks + 1]int {
	var k [numRanks + 1]int
	ix, u := r.s.ix, r.s.u
	i := 0
	for l := rankZone; l >= rankNVLink; l-- {
		if ix.labelled[l] && u.busy[l][ix.hosts[h].group[l]] == 0 {
			k[i] = 1
		}
		i++
	}
	if u.hostBusy[h] == 0 {
		k[i] = 1
	}
	k[i+1] = left
	k[i+2] = h
	return k
}

// clean reports whether nothing of host h or of its labelled groups is
// taken or failed (and no gang bundle is on it): such a host's key starts
// with all ones and its free devices depend on its shape only.
func (r *run) clean(h int) bool {
	ix, u := r.s.ix, r.s.u
	if u.hostBusy[h] != 0 {
		return false
	}
	for i, l := range ix.labelledRanks {
		if u.busy[l][ix.lgroup[i][h]] != 0 {
			return false
		}
	}
	return !u.failedHost[h] && u.cpuUsed[h] == 0 && u.memUsed[h] == 0 && r.gang[h] == 0
}

// shapeTop holds the lowest host positions of clean, eligible hosts of
// one shape seen by one candidates scan (freshCandidates of them).
type shapeTop struct {
	n int
	h [freshCandidates]int
}

func (t *shapeTop) add(h int) {
	pos := t.n
	for pos > 0 && h < t.h[pos-1] {
		pos--
	}
	if pos >= len(t.h) {
		return
	}
	if t.n < len(t.h) {
		t.n++
	}
	copy(t.h[pos+1:t.n], t.h[pos:t.n-1])
	t.h[pos] = h
}

func lessKey(a, b [numRanks + 1]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// freshCandidates is how many hosts unrelated to the gang the greedy
// step evaluates (best by anti-fragmentation order).
const freshCandidates = 2

// candidates lists the hosts worth evaluating for b: hosts of the gang,
// hosts of b's placed traffic peers and of their NVLink domain or slice,
// and the best few other hosts by anti-fragmentation order.
func (r *run) candidates(b int) []int {
	s := r.s
	s.gen++
	var out []int
	add := func(h int) {
		if s.seen[h] == s.gen {
			return
		}
		s.seen[h] = s.gen
		if r.domHosts != nil && !r.domMark[h] {
			return
		}
		if r.hostFree(b, h) >= 0 {
			out = append(out, h)
		}
	}
	for _, h := range r.gangH {
		add(h)
	}
	for _, ei := range s.cr.adj[b] {
		e := s.cr.edges[ei]
		o := e.from
		if o == b {
			o = e.to
		}
		ph := r.a[o].host
		if ph < 0 {
			continue
		}
		add(ph)
		for _, l := range []int{rankNVLink, rankSlice} {
			if !s.ix.labelled[l] {
				continue
			}
			g := &s.ix.groups[l][s.ix.hosts[ph].group[l]]
			if len(g.hosts) < 2 {
				continue
			}
			for _, h := range g.hosts {
				add(h)
			}
		}
	}
	var best [freshCandidates]int
	var bestKey [freshCandidates][numRanks + 1]int
	nb := 0
	fresh := r.sc.hosts
	if r.domHosts != nil {
		fresh = r.domHosts
	}
	// Clean hosts (clean) of one shape serve b alike and share the
	// top of the key, so only their host position tells them apart: once
	// two of a shape are ranked, a clean one further on cannot beat them
	// and is skipped unevaluated. This keeps the scan of a 100k-GPU fleet
	// to a few loads per host.
	if len(r.shapeTop) != s.ix.shapes {
		r.shapeTop = make([]shapeTop, s.ix.shapes)
	}
	for i := range r.shapeTop {
		r.shapeTop[i].n = 0
	}
	for _, h := range fresh {
		if s.seen[h] == s.gen {
			continue
		}
		st := &r.shapeTop[s.ix.shapeOf[h]]
		clean := r.clean(h)
		if clean && st.n == len(st.h) && h > st.h[len(st.h)-1] {
			continue
		}
		left := r.hostFree(b, h)
		if left < 0 {
			continue
		}
		if clean {
			st.add(h)
		}
		k := r.fragKey(h, left-s.cr.bundles[b].devices)
		// insert into the small sorted top list
		pos := nb
		for pos > 0 && lessKey(k, bestKey[pos-1]) {
			pos--
		}
		if pos >= freshCandidates {
			continue
		}
		if nb < freshCandidates {
			nb++
		}
		copy(best[pos+1:nb], best[pos:nb-1])
		copy(bestKey[pos+1:nb], bestKey[pos:nb-1])
		best[pos], bestKey[pos] = h, k
	}
	for i := 0; i < nb; i++ {
		s.seen[best[i]] = s.gen
		out = append(out, best[i])
	}
	return out
}

// bestHost picks b's host and devices: the lowest estimated cost, with the
// strategy's host preference and the anti-fragmentation order breaking
// ties (SPREAD puts its host preference first).
func (r *run) bestHost(b int) (int, []int) {
	s := r.s
	bestH := -1
	var bestDevs []int
	var bk candKey
	for _, h := range r.candidates(b) {
		devs := s.pickDevices(b, h, r.sc.numa)
		if devs == nil && s.cr.bundles[b].devices > 0 {
			continue
		}
		k := r.key(b, h, devs)
		if bestH < 0 || k.less(bk) {
			bestH, bestDevs, bk = h, devs, k
		}
	}
	return bestH, bestDevs
}

type candKey struct {
	spread  int // SPREAD: 1 if the host holds a gang bundle already
	cost    float64
	sum     float64
	newHost int // PACK: 1 if the host holds no gang bundle yet
	frag    [numRanks + 1]int
}

func (a candKey) less(b candKey) bool {
	if a.spread != b.spread {
		return a.spread < b.spread
	}
	if c := cmpFloat(a.cost, b.cost); c != 0 {
		return c < 0
	}
	if c := cmpFloat(a.sum, b.sum); c != 0 {
		return c < 0
	}
	if a.newHost != b.newHost {
		return a.newHost < b.newHost
	}
	return lessKey(a.frag, b.frag)
}

func (r *run) key(b, h int, devs []int) candKey {
	s := r.s
	var k candKey
	k.cost, k.sum = r.delta(b, h, devs)
	switch s.cr.strategy {
	case Spread:
		if r.gang[h] > 0 {
			k.spread = 1
		}
	case Pack, StrictPack:
		if r.gang[h] == 0 {
			k.newHost = 1
		}
	}
	left := r.hostFree(b, h) - s.cr.bundles[b].devices
	k.frag = r.fragKey(h, left)
	return k
}

// pickDevices chooses b's devices on host h: all under one PCIe switch if
// one has room (the fullest that fits), else within one NUMA node (the
// fullest that fits), else over as few NUMA nodes as it can; inside a node
// partly used switches go first. It returns nil when h cannot serve b.
func (s *solver) pickDevices(b, h, numa int) []int {
	need := s.cr.bundles[b].devices
	if need == 0 {
		return []int{}
	}
	hi := &s.ix.hosts[h]
	var elig []int
	swCount := map[string]int{}
	numaCount := map[int]int{}
	for d := range hi.devs {
		if s.u.available(h, d) && s.devOK(b, h, d, numa) {
			elig = append(elig, d)
			swCount[hi.devs[d].sw]++
			numaCount[hi.devs[d].numa]++
		}
	}
	if len(elig) < need {
		return nil
	}
	// One switch.
	bestSw, bestN := "", 0
	for _, d := range elig {
		sw := hi.devs[d].sw
		if sw == "" {
			continue
		}
		if n := swCount[sw]; n >= need && (bestN == 0 || n < bestN) {
			bestSw, bestN = sw, n
		}
	}
	if bestN > 0 {
		out := make([]int, 0, need)
		for _, d := range elig {
			if hi.devs[d].sw == bestSw && len(out) < need {
				out = append(out, d)
			}
		}
		return out
	}
	// Order NUMA nodes: one that fits (fullest first), else most free first.
	nodes := append([]int(nil), hi.numas...)
	fits := func(n int) bool { return numaCount[n] >= need }
	sortStable(nodes, func(a, b int) bool {
		fa, fb := fits(a), fits(b)
		if fa != fb {
			return fa
		}
		if fa {
			return numaCount[a] < numaCount[b]
		}
		return numaCount[a] > numaCount[b]
	})
	out := make([]int, 0, need)
	for _, n := range nodes {
		var in []int
		for _, d := range elig {
			if hi.devs[d].numa == n {
				in = append(in, d)
			}
		}
		sortStable(in, func(a, b int) bool {
			ca, cb := swCount[hi.devs[a].sw], swCount[hi.devs[b].sw]
			if ca != cb {
				return ca < cb
			}
			return false
		})
		for _, d := range in {
			if len(out) < need {
				out = append(out, d)
			}
		}
		if len(out) == need {
			break
		}
	}
	sortInts(out)
	return out
}

func sortStable(x []int, less func(a, b int) bool) {
	for i := 1; i < len(x); i++ {
		for j := i; j > 0 && less(x[j], x[j-1]); j-- {
			x[j], x[j-1] = x[j-1], x[j]
		}
	}
}
