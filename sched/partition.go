package sched

import (
	"container/heap"
	"sort"
)

// The partition start is another way to build a placement, tried next to
// the plain greedy whenever a scope spans several domains (NVLink domains
// or TPU slices, whose host-to-host links are far faster than the network;
// hosts where a cluster has neither). The plain greedy walks bundles in
// maximum-adjacency order and, when a domain fills up, can cut a heavy
// chain in the middle or strand a bundle away from its heaviest peer. The
// partition start first clusters the traffic graph: the most strongly
// linked components merge first while the merged one still fits the
// largest free domain (a dendrogram, as in agglomerative clustering). A
// pair weighs its traffic per device of its smaller bundle, the load a cut
// puts on one NIC. It then places whole components, heaviest first, each
// into the domain that costs least among the domains holding its placed
// peers (the two with most traffic to it) and the two best free ones by
// the anti-fragmentation order. A component that no domain holds is split
// at its last merge and its halves are placed the same way, so cuts fall
// on the weakest links. Every start gets the local search; the best result
// wins, ties to the plain greedy.

// domainRank picks the level the partition start packs into.
func (ix *index) domainRank() int {
	for _, l := range []int{rankNVLink, rankSlice} {
		if !ix.labelled[l] {
			continue
		}
		for _, g := range ix.groups[l] {
			if len(g.hosts) > 1 {
				return l
			}
		}
	}
	return rankHost
}

// pnode is a dendrogram node: a leaf holds one bundle, an inner node the
// union of its two children, merged over the pair weight w.
type pnode struct {
	kids [2]int // -1, -1 for a leaf
	b    int    // a leaf's bundle; an inner node's lowest bundle
	dev  int    // devices of its bundles
	// units bounds merging: devices, and 1 for a bundle without devices,
	// so that no component grows past the largest free domain's device
	// count in bundles either (which bounds the work of splitting).
	units int
	w     float64
}

// pdomain is one domain of the scope.
type pdomain struct {
	g     int   // group at the domain rank
	hosts []int // its hosts inside the scope, in cluster order
}

// partition is a partition start's plan for one scope.
type partition struct {
	rank    int
	domains []pdomain
	domOf   []int // host -> index into domains, -1 outside the scope
	nodes   []pnode
	roots   []int // components to place, heaviest first
	loose   []int // bundles without traffic to other free bundles
}

// partition returns the plan for scope sc, or nil when the partition
// start cannot differ from the plain greedy.
func (s *solver) partition(sc *scope, total bool) *partition {
	ix := s.ix
	if !s.cr.traffic || sc.numa >= 0 {
		return nil
	}
	L := ix.domainRank()
	if L == rankHost && (s.cr.strategy == Spread || s.cr.strategy == StrictSpread) {
		return nil
	}
	p := &partition{rank: L, domOf: make([]int, len(ix.hosts))}
	for i := range p.domOf {
		p.domOf[i] = -1
	}
	byG := map[int]int{}
	for _, h := range sc.hosts {
		g := ix.hosts[h].group[L]
		d, ok := byG[g]
		if !ok {
			d = len(p.domains)
			byG[g] = d
			p.domains = append(p.domains, pdomain{g: g})
		}
		p.domains[d].hosts = append(p.domains[d].hosts, h)
		p.domOf[h] = d
	}
	if len(p.domains) < 2 {
		return nil
	}
	maxCap := 0
	for d := range p.domains {
		maxCap = max(maxCap, s.domainFree(p, d))
	}
	// Undirected pair weights between free bundles.
	n := len(s.cr.bundles)
	type pair struct {
		a, b int
		w    float64
	}
	at := map[[2]int]int{}
	var pairs []pair
	for _, e := range s.cr.edges {
		if s.pinned[e.from].host >= 0 || s.pinned[e.to].host >= 0 {
			continue
		}
		k := [2]int{min(e.from, e.to), max(e.from, e.to)}
		i, ok := at[k]
		if !ok {
			i = len(pairs)
			at[k] = i
			pairs = append(pairs, pair{a: k[0], b: k[1]})
		}
		// A cut pair loads the NIC of each device of the smaller bundle
		// with gb/min(devices): that, not gb, is what a cut costs.
		pairs[i].w += e.gb / float64(max(1, min(s.cr.bundles[e.from].devices, s.cr.bundles[e.to].devices)))
	}
	// Agglomerate: repeatedly merge the two components with the heaviest
	// linkage that still fit. Total linkage sums the pair weights between
	// two components, single linkage takes the heaviest pair; neither wins
	// everywhere (a group with many medium ties to a component against one
	// heavy pair), so small gangs try both. A heap with stale entries
	// skipped keeps it O(E log E).
	parent := make([]int, n)
	top := make([]int, n)
	link := make([]map[int]float64, n) // root -> root -> linkage
	for b := 0; b < n; b++ {
		parent[b] = b
		top[b] = len(p.nodes)
		d := s.cr.bundles[b].devices
		p.nodes = append(p.nodes, pnode{kids: [2]int{-1, -1}, b: b, dev: d, units: max(d, 1)})
	}
	hasEdge := make([]bool, n)
	h := &linkHeap{}
	for _, pr := range pairs {
		hasEdge[pr.a], hasEdge[pr.b] = true, true
		for _, x := range [2][2]int{{pr.a, pr.b}, {pr.b, pr.a}} {
			if link[x[0]] == nil {
				link[x[0]] = map[int]float64{}
			}
			link[x[0]][x[1]] = pr.w
		}
		h.push(linkItem{w: pr.w, a: pr.a, b: pr.b})
	}
	for h.Len() > 0 {
		it := h.pop()
		ra, rb := it.a, it.b
		if parent[ra] != ra || parent[rb] != rb || link[ra][rb] != it.w {
			continue // stale: a side was merged, or the linkage grew
		}
		ta, tb := top[ra], top[rb]
		na, nb := p.nodes[ta], p.nodes[tb]
		if na.units+nb.units > maxCap {
			continue // components only grow: never fits later either
		}
		// Keep the root with the larger linkage map; fold the other in.
		keep, gone := ra, rb
		if len(link[gone]) > len(link[keep]) {
			keep, gone = gone, keep
		}
		parent[gone] = keep
		delete(link[keep], gone)
		for x, w := range link[gone] {
			if x == keep {
				continue
			}
			delete(link[x], gone)
			if total {
				link[keep][x] += w
			} else {
				link[keep][x] = max(link[keep][x], w)
			}
			link[x][keep] = link[keep][x]
		}
		link[gone] = nil
		// Push the new linkages in a fixed order (map order is random).
		xs := make([]int, 0, len(link[keep]))
		for x := range link[keep] {
			xs = append(xs, x)
		}
		sort.Ints(xs)
		for _, x := range xs {
			h.push(linkItem{w: link[keep][x], a: min(keep, x), b: max(keep, x)})
		}
		top[keep] = len(p.nodes)
		p.nodes = append(p.nodes, pnode{kids: [2]int{ta, tb}, b: min(na.b, nb.b), dev: na.dev + nb.dev, units: na.units + nb.units, w: na.w + nb.w + it.w})
	}
	find := func(x int) int {
		for parent[x] != x {
			x = parent[x]
		}
		return x
	}
	for b := 0; b < n; b++ {
		if s.pinned[b].host >= 0 {
			continue
		}
		if !hasEdge[b] {
			p.loose = append(p.loose, b)
		} else if find(b) == b {
			p.roots = append(p.roots, top[b])
		}
	}
	p.sortNodes(p.roots)
	return p
}

// sortNodes orders components for placement: most inner traffic first,
// then most devices, then lowest bundle.
func (p *partition) sortNodes(ns []int) {
	sort.SliceStable(ns, func(i, j int) bool {
		a, b := &p.nodes[ns[i]], &p.nodes[ns[j]]
		if a.w != b.w {
			return a.w > b.w
		}
		if a.dev != b.dev {
			return a.dev > b.dev
		}
		return a.b < b.b
	})
}

// leaves appends node x's bundles.
func (p *partition) leaves(out []int, x int) []int {
	nd := &p.nodes[x]
	if nd.kids[0] < 0 {
		return append(out, nd.b)
	}
	out = p.leaves(out, nd.kids[0])
	return p.leaves(out, nd.kids[1])
}

// domainFree counts the free devices of domain d.
func (s *solver) domainFree(p *partition, d int) int {
	n := 0
	for _, h := range p.domains[d].hosts {
		if s.u.failedHost[h] {
			continue
		}
		for dv := range s.ix.hosts[h].devs {
			if s.u.available(h, dv) {
				n++
			}
		}
	}
	return n
}

// freshDomains is how many domains without placed peers a component
// tries (best by the anti-fragmentation order), affineDomains how many
// with placed peers (most traffic to them first).
const (
	freshDomains  = 2
	affineDomains = 2
)

// placePartition builds a placement from the plan: components into
// domains, splitting those that fit nowhere, then the loose bundles by the
// plain greedy. It reports false when some bundle found no host.
func (r *run) placePartition(p *partition) bool {
	s := r.s
	pos := make([]int, len(s.cr.bundles))
	for i, b := range s.order {
		pos[b] = i
	}
	r.domMark = make([]bool, len(s.ix.hosts))
	queue := append([]int(nil), p.roots...)
	var members []int
	for len(queue) > 0 {
		x := queue[0]
		queue = queue[1:]
		members = p.leaves(members[:0], x)
		sort.Slice(members, func(i, j int) bool { return pos[members[i]] < pos[members[j]] })
		if r.placeComponent(p, p.nodes[x].dev, members) {
			continue
		}
		nd := &p.nodes[x]
		if nd.kids[0] < 0 {
			h, devs := r.bestHost(nd.b)
			if h < 0 {
				return false
			}
			r.place(nd.b, h, devs, true)
			continue
		}
		kids := []int{nd.kids[0], nd.kids[1]}
		p.sortNodes(kids)
		queue = append(kids, queue...)
	}
	loose := append([]int(nil), p.loose...)
	sort.Slice(loose, func(i, j int) bool { return pos[loose[i]] < pos[loose[j]] })
	for _, b := range loose {
		h, devs := r.bestHost(b)
		if h < 0 {
			return false
		}
		r.place(b, h, devs, true)
	}
	return true
}

// placeComponent puts all of members into one domain: it tries the
// domains that hold placed traffic peers and the best fresh ones, keeps
// the cheapest (ties to the earlier tried), and reports false when none
// holds them all.
func (r *run) placeComponent(p *partition, dev int, members []int) bool {
	s := r.s
	ix := s.ix
	// Domains of placed peers, most traffic first, at most affineDomains.
	var cands []int
	seen := map[int]bool{}
	pull := map[int]float64{}
	for _, b := range members {
		for _, ei := range s.cr.adj[b] {
			e := s.cr.edges[ei]
			o := e.from
			if o == b {
				o = e.to
			}
			h := r.a[o].host
			if h < 0 {
				continue
			}
			if d := p.domOf[h]; d >= 0 {
				if !seen[d] {
					seen[d] = true
					cands = append(cands, d)
				}
				pull[d] += e.gb
			}
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		if pull[cands[i]] != pull[cands[j]] {
			return pull[cands[i]] > pull[cands[j]]
		}
		return cands[i] < cands[j]
	})
	if len(cands) > affineDomains {
		cands = cands[:affineDomains]
	}
	type fresh struct{ d, used, free int }
	var best []fresh
	for d, dm := range p.domains {
		if seen[d] {
			continue
		}
		free := s.domainFree(p, d)
		if free < dev {
			continue
		}
		used := 1
		if s.u.busy[p.rank][dm.g] > 0 {
			used = 0
		}
		f := fresh{d, used, free}
		i := len(best)
		for i > 0 && (f.used < best[i-1].used || f.used == best[i-1].used && f.free < best[i-1].free) {
			i--
		}
		if i >= freshDomains {
			continue
		}
		best = append(best, fresh{})
		copy(best[i+1:], best[i:])
		best[i] = f
		if len(best) > freshDomains {
			best = best[:freshDomains]
		}
	}
	for _, f := range best {
		cands = append(cands, f.d)
	}
	type spot struct {
		b, h int
		devs []int
	}
	var keep []spot
	var keepScore score
	for _, d := range cands {
		if s.domainFree(p, d) < dev {
			continue
		}
		for _, h := range p.domains[d].hosts {
			r.domMark[h] = true
		}
		r.domHosts = p.domains[d].hosts
		ok := true
		placed := 0
		for _, b := range members {
			h, devs := r.bestHost(b)
			if h < 0 {
				ok = false
				break
			}
			r.place(b, h, devs, true)
			placed++
		}
		if ok {
			if sc := r.score(); keep == nil || sc.less(keepScore) {
				keep, keepScore = keep[:0], sc
				for _, b := range members {
					keep = append(keep, spot{b, r.a[b].host, r.a[b].devs})
				}
			}
		}
		for _, b := range members[:placed] {
			r.unplace(b, true)
		}
		for _, h := range p.domains[d].hosts {
			r.domMark[h] = false
		}
		r.domHosts = nil
	}
	_ = ix
	if keep == nil {
		return false
	}
	for _, x := range keep {
		r.place(x.b, x.h, x.devs, true)
	}
	return true
}

// linkItem is a candidate merge of two component roots a < b.
type linkItem struct {
	w    float64
	a, b int
}

// linkHeap pops the heaviest linkage first, ties to the lowest (a, b), so
// that the merge order is deterministic.
type linkHeap []linkItem

func (h linkHeap) Len() int { return len(h) }
func (h linkHeap) Less(i, j int) bool {
	if h[i].w != h[j].w {
		return h[i].w > h[j].w
	}
	if h[i].a != h[j].a {
		return h[i].a < h[j].a
	}
	return h[i].b < h[j].b
}
func (h linkHeap) Swap(i, j int)    { h[i], h[j] = h[j], h[i] }
func (h *linkHeap) Push(x any)      { *h = append(*h, x.(linkItem)) }
func (h *linkHeap) Pop() any        { old := *h; x := old[len(old)-1]; *h = old[:len(old)-1]; return x }
func (h *linkHeap) push(x linkItem) { heap.Push(h, x) }
func (h *linkHeap) pop() linkItem   { return heap.Pop(h).(linkItem) }
