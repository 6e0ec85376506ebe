package sched

import (
	"math"
	"sort"

	"github.com/tensorlane/tensorlane/topology"
)

// asg is a bundle's tentative place: host position and device positions.
type asg struct {
	host int
	devs []int
}

// solver places one compiled request against a usage. It mutates the usage
// during the search and leaves it as it found it.
type solver struct {
	ix     *index
	cfg    Config
	u      *usage
	cr     *creq
	pinned []asg // per bundle; host -1 when free to place
	match  [][]int8
	order  []int // bundle placement order
	seen   []int // per host, generation marks for candidate sets
	gen    int
	work   int // edge evaluations of all runs (tests read it)
}

func newSolver(ix *index, cfg Config, u *usage, cr *creq, pinned []asg) *solver {
	s := &solver{ix: ix, cfg: cfg, u: u, cr: cr, pinned: pinned, seen: make([]int, len(ix.hosts))}
	if s.pinned == nil {
		s.pinned = make([]asg, len(cr.bundles))
		for i := range s.pinned {
			s.pinned[i].host = -1
		}
	}
	s.match = make([][]int8, len(cr.classes))
	s.order = s.bundleOrder()
	return s
}

// selectorOK reports whether bundle b's selector admits host h (cached per
// bundle class).
func (s *solver) selectorOK(b, h int) bool {
	cl := s.cr.bundles[b].class
	if s.match[cl] == nil {
		s.match[cl] = make([]int8, len(s.ix.hosts))
	}
	m := s.match[cl][h]
	if m == 0 {
		m = 1
		for _, t := range s.cr.bundles[b].sel {
			if !t.match(s.ix.hosts[h].h) {
				m = -1
				break
			}
		}
		s.match[cl][h] = m
	}
	return m > 0
}

// devOK reports whether device position d of host h can serve bundle b,
// ignoring whether it is free.
func (s *solver) devOK(b, h, d, numa int) bool {
	bd := &s.cr.bundles[b]
	dv := &s.ix.hosts[h].devs[d]
	if bd.kind != "" && bd.kind != dv.kind {
		return false
	}
	if dv.mem < bd.memBytes {
		return false
	}
	if s.cr.NICAffinity && !dv.nicAffine {
		return false
	}
	return numa < 0 || dv.numa == numa
}

// bundleOrder: with traffic, a maximum-adjacency order (the bundle with
// the most traffic first, then repeatedly the one with the most traffic to
// those already ordered), so that heavy neighbours land next to each
// other; without traffic, largest bundles first. Ties go to the lower
// index.
func (s *solver) bundleOrder() []int {
	n := len(s.cr.bundles)
	order := make([]int, 0, n)
	done := make([]bool, n)
	for b := range s.pinned {
		if s.pinned[b].host >= 0 {
			done[b] = true
		}
	}
	larger := func(a, b int) bool {
		ba, bb := &s.cr.bundles[a], &s.cr.bundles[b]
		if ba.devices != bb.devices {
			return ba.devices > bb.devices
		}
		if ba.memBytes != bb.memBytes {
			return ba.memBytes > bb.memBytes
		}
		return a < b
	}
	if !s.cr.traffic {
		for b := 0; b < n; b++ {
			if !done[b] {
				order = append(order, b)
			}
		}
		sort.SliceStable(order, func(i, j int) bool { return larger(order[i], order[j]) })
		return order
	}
	total := make([]float64, n)
	conn := make([]float64, n)
	for _, e := range s.cr.edges {
		total[e.from] += e.gb
		total[e.to] += e.gb
	}
	addConn := func(b int) {
		for _, ei := range s.cr.adj[b] {
			e := s.cr.edges[ei]
			conn[e.from] += e.gb
			conn[e.to] += e.gb
		}
	}
	for b := 0; b < n; b++ {
		if done[b] {
			addConn(b)
		}
	}
	pinned := countTrue(done)
	for len(order)+pinned < n {
		best := -1
		for b := 0; b < n; b++ {
			if done[b] {
				continue
			}
			if best < 0 {
				best = b
				continue
			}
			switch {
			case conn[b] != conn[best]:
				if conn[b] > conn[best] {
					best = b
				}
			case total[b] != total[best]:
				if total[b] > total[best] {
					best = b
				}
			case larger(b, best):
				best = b
			}
		}
		if best < 0 {
			break
		}
		done[best] = true
		order = append(order, best)
		addConn(best)
	}
	return order
}

func countTrue(b []bool) int {
	n := 0
	for _, v := range b {
		if v {
			n++
		}
	}
	return n
}

// scope confines a run: hosts whose group at each constraint's rank
// matches, and optionally one NUMA node (with a single host).
type scope struct {
	cons  [][2]int // (rank, group)
	numa  int      // -1 for any
	hosts []int    // the member hosts, in cluster order
	rank  int      // the level the scope stands for
	name  string
	order int // position in its level's anti-fragmentation order
}

func (sc *scope) has(ix *index, h int) bool {
	for _, c := range sc.cons {
		if c[0] == rankNUMA {
			continue
		}
		if ix.hosts[h].group[c[0]] != c[1] {
			return false
		}
	}
	return true
}

// result is one feasible placement found by a run.
type result struct {
	a        []asg
	numa     []int
	cost     float64
	sum      float64
	achieved int // the rank of the scope it was found in
	shared   int // SPREAD: bundles that share a host with another
	order    int
	scopeKey string
}

// better orders results: achieved level first when explicit, then cost,
// then the summed busy time, then anti-fragmentation order.
func (r *result) better(o *result, explicit bool) bool {
	if o == nil {
		return true
	}
	if r.shared != o.shared {
		return r.shared < o.shared
	}
	if explicit && r.achieved != o.achieved {
		return r.achieved < o.achieved
	}
	if c := cmpFloat(r.cost, o.cost); c != 0 {
		return c < 0
	}
	if c := cmpFloat(r.sum, o.sum); c != 0 {
		return c < 0
	}
	if r.achieved != o.achieved {
		return r.achieved < o.achieved
	}
	return r.order < o.order
}

func cmpFloat(a, b float64) int {
	tol := 1e-9 * math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
	switch {
	case a < b-tol:
		return -1
	case a > b+tol:
		return 1
	}
	return 0
}

// effectiveRequired folds STRICT_PACK into the required level.
func (s *solver) effectiveRequired() int {
	r := s.cr.required
	if s.cr.strategy == StrictPack && r > rankHost {
		r = rankHost
	}
	return r
}

// solve searches the scopes: groups of the required level (best
// anti-fragmentation first), within each the preferred level climbing up,
// and with traffic but no preference every smaller level as an
// alternative. It returns nil when nothing was found.
func (s *solver) solve() *result {
	reqRank := s.effectiveRequired()
	var best *result
	found := 0
	explicit := s.cr.preferred >= 0
	for _, R := range s.groupsAt(reqRank, nil) {
		res := s.solveWithin(R, reqRank)
		if res == nil {
			continue
		}
		if res.better(best, explicit) {
			best = res
		}
		if found++; found >= s.cfg.Candidates {
			break
		}
	}
	return best
}

func (s *solver) solveWithin(R *scope, reqRank int) *result {
	var levels []int
	explicit := s.cr.preferred >= 0
	switch {
	case explicit:
		for l := s.cr.preferred; l < reqRank; l++ {
			if l == s.cr.preferred || s.ix.distinctLevel(l) {
				levels = append(levels, l)
			}
		}
	case s.cr.traffic && reqRank > rankHost:
		first := rankHost
		if s.cr.strategy == Spread || s.cr.strategy == StrictSpread {
			first = rankNVLink
		}
		for _, l := range []int{rankHost, rankNVLink, rankSlice, rankRack} {
			if l < first {
				continue
			}
			if l < reqRank && s.ix.distinctLevel(l) {
				levels = append(levels, l)
			}
		}
	}
	var best *result
	for _, l := range levels {
		var lbest *result
		found := 0
		for _, sub := range s.groupsAt(l, R) {
			res := s.run(sub)
			if res == nil {
				continue
			}
			res.achieved = l
			if res.better(lbest, false) {
				lbest = res
			}
			if found++; found >= s.cfg.Candidates {
				break
			}
		}
		if lbest != nil && explicit {
			return lbest
		}
		if lbest != nil && lbest.better(best, false) {
			best = lbest
		}
	}
	res := s.run(R)
	if res != nil {
		res.achieved = reqRank
		if res.better(best, false) {
			best = res
		}
	}
	return best
}

// distinctLevel reports whether level r partitions hosts differently from
// every lower level (host and numa always count).
func (ix *index) distinctLevel(r int) bool {
	if r <= rankHost {
		return true
	}
	if !ix.labelled[r] {
		return false
	}
	for l := rankHost; l < r; l++ {
		if (l == rankHost || ix.labelled[l]) && samePartition(ix, r, l) {
			return false
		}
	}
	return true
}

// groupsAt lists the scopes of level r (within R when given) that could
// hold the gang by a capacity count, holding every pinned bundle, in the
// anti-fragmentation order: partly used groups first, then the fewest
// free devices, then cluster order.
func (s *solver) groupsAt(r int, R *scope) []*scope {
	ix := s.ix
	var hosts []int
	if R != nil {
		hosts = R.hosts
	} else {
		hosts = make([]int, len(ix.hosts))
		for i := range hosts {
			hosts[i] = i
		}
	}
	var out []*scope
	if r == rankNUMA {
		for _, h := range hosts {
			for _, nu := range ix.hosts[h].numas {
				sc := &scope{numa: nu, hosts: []int{h}, rank: r, name: ix.hosts[h].id + "/numa" + itoa(nu)}
				if R != nil {
					sc.cons = append(sc.cons, R.cons...)
				}
				sc.cons = append(sc.cons, [2]int{rankHost, ix.hosts[h].group[rankHost]})
				out = append(out, sc)
			}
		}
	} else {
		byG := map[int]*scope{}
		for _, h := range hosts {
			g := ix.hosts[h].group[r]
			sc, ok := byG[g]
			if !ok {
				sc = &scope{numa: -1, rank: r, name: ix.groups[r][g].name}
				if R != nil {
					sc.cons = append(sc.cons, R.cons...)
					sc.numa = R.numa
				}
				sc.cons = append(sc.cons, [2]int{r, g})
				byG[g] = sc
				out = append(out, sc)
			}
			sc.hosts = append(sc.hosts, h)
		}
	}
	type ranked struct {
		sc         *scope
		busy, free int
	}
	var rs []ranked
	for _, sc := range out {
		free, busy, ok := s.capacity(sc)
		if ok {
			rs = append(rs, ranked{sc, busy, free})
		}
	}
	sort.SliceStable(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if (a.busy == 0) != (b.busy == 0) {
			return a.busy != 0
		}
		return a.free < b.free
	})
	out = out[:0]
	for i, x := range rs {
		x.sc.order = i
		out = append(out, x.sc)
	}
	return out
}

// capacity checks a scope by counting: free devices per requested kind,
// hosts for STRICT_SPREAD, and the hosts of pinned bundles. It returns the
// free device count and the busy count for the ordering.
func (s *solver) capacity(sc *scope) (free, busy int, ok bool) {
	ix, u := s.ix, s.u
	for _, p := range s.pinned {
		if p.host < 0 {
			continue
		}
		if !contains1(sc.hosts, p.host) {
			return 0, 0, false
		}
		if sc.numa >= 0 {
			for _, d := range p.devs {
				if ix.hosts[p.host].devs[d].numa != sc.numa {
					return 0, 0, false
				}
			}
		}
	}
	byKind := map[topology.DeviceKind]int{}
	live := 0
	for _, h := range sc.hosts {
		if u.failedHost[h] {
			continue
		}
		live++
		for d, dv := range ix.hosts[h].devs {
			if sc.numa >= 0 && dv.numa != sc.numa {
				continue
			}
			if u.available(h, d) {
				byKind[dv.kind]++
				free++
			} else {
				busy++
			}
		}
	}
	need := 0
	for _, k := range s.cr.kinds {
		if k == "" {
			continue
		}
		if byKind[k] < s.cr.totalDev[k] {
			return 0, 0, false
		}
		need += s.cr.totalDev[k]
	}
	if free < need+s.cr.totalDev[""] {
		return 0, 0, false
	}
	if s.cr.strategy == StrictSpread && live < len(s.cr.bundles) {
		return 0, 0, false
	}
	if live == 0 {
		return 0, 0, false
	}
	return free, busy, true
}

func contains1(xs []int, x int) bool {
	i := sort.SearchInts(xs, x)
	return i < len(xs) && xs[i] == x
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	neg := i < 0
	if neg {
		i = -i
	}
	var b [20]byte
	n := len(b)
	for i > 0 {
		n--
		b[n] = digits[i%10]
		i /= 10
	}
	if neg {
		n--
		b[n] = '-'
	}
	return string(b[n:])
}
