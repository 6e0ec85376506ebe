package sched

// improve is a bounded local search after the greedy pass, for gangs with
// traffic of at most Config.LocalSearch bundles: move a bundle to another
// candidate host, swap the places of two bundles (b goes next to one of
// its traffic peers: onto its host or into its NVLink domain or slice; the
// pass over c covers swaps that bring c closer), or evict a bundle from a
// peer's host, when that strictly lowers (busiest resource, summed busy
// time). SPREAD keeps
// its host count. It is deterministic: bundles in index order, at most
// four passes and localSearchWork edge evaluations.
func (r *run) improve() {
	s := r.s
	n := len(s.cr.bundles)
	if !s.cr.traffic || s.cfg.LocalSearch < 0 || n > s.cfg.LocalSearch {
		return
	}
	budget := r.work + localSearchWork
	for pass := 0; pass < 4; pass++ {
		improved := false
		for b := 0; b < n && r.work < budget; b++ {
			if s.pinned[b].host >= 0 || len(s.cr.adj[b]) == 0 {
				continue
			}
			if r.tryMove(b) {
				improved = true
			}
			if r.work < budget && r.tryEvict(b) {
				improved = true
			}
			near := r.nearPeers(b)
			for c := 0; c < n && r.work < budget; c++ {
				if c != b && near(r.a[c].host) && r.trySwap(b, c) {
					improved = true
				}
			}
		}
		if !improved {
			return
		}
	}
}

// nearPeers reports whether host h is a host of one of b's placed traffic
// peers or shares a multi-host NVLink domain or slice with one.
func (r *run) nearPeers(b int) func(h int) bool {
	s := r.s
	ix := s.ix
	var hosts []int
	var groups [][2]int
	for _, ei := range s.cr.adj[b] {
		e := s.cr.edges[ei]
		o := e.from
		if o == b {
			o = e.to
		}
		ph := r.a[o].host
		if ph < 0 || containsInt(hosts, ph) {
			continue
		}
		hosts = append(hosts, ph)
		for _, l := range []int{rankNVLink, rankSlice} {
			if g := ix.hosts[ph].group[l]; ix.labelled[l] && len(ix.groups[l][g].hosts) > 1 {
				groups = append(groups, [2]int{l, g})
			}
		}
	}
	return func(h int) bool {
		if h < 0 {
			return false
		}
		if containsInt(hosts, h) {
			return true
		}
		for _, g := range groups {
			if ix.hosts[h].group[g[0]] == g[1] {
				return true
			}
		}
		return false
	}
}

// localSearchWork bounds the improvement pass (deterministically: it
// counts edge evaluations, not time).
const localSearchWork = 400000

type score struct {
	spread int
	cost   float64
	sum    float64
}

func (a score) less(b score) bool {
	if a.spread != b.spread {
		return a.spread < b.spread
	}
	if c := cmpFloat(a.cost, b.cost); c != 0 {
		return c < 0
	}
	return cmpFloat(a.sum, b.sum) < 0
}

func (r *run) score() score {
	sc := score{cost: r.curMax(), sum: r.sum}
	if r.s.cr.strategy == Spread {
		sc.spread = len(r.s.cr.bundles) - len(r.gangH)
	}
	return sc
}

// A mark remembers the busiest load and the summed busy time, so that a
// trial place/unplace pair, which returns every load to where it was, does
// not pay for a scan of all loads (unplace alone cannot tell the new
// maximum).
type mark struct{ max, sum float64 }

func (r *run) mark() mark { return mark{r.curMax(), r.sum} }

func (r *run) reset(m mark) { r.maxLoad, r.dirty, r.sum = m.max, false, m.sum }

func (r *run) tryMove(b int) bool {
	s := r.s
	old := r.a[b]
	cur := r.score()
	before := r.mark()
	r.unplace(b, true)
	base := r.mark()
	bestH, bestDevs, best := old.host, old.devs, cur
	for _, h := range r.candidates(b) {
		devs := s.pickDevices(b, h, r.sc.numa)
		if devs == nil && s.cr.bundles[b].devices > 0 {
			continue
		}
		r.place(b, h, devs, true)
		if sc := r.score(); sc.less(best) {
			bestH, bestDevs, best = h, devs, sc
		}
		r.unplace(b, true)
		r.reset(base)
	}
	r.place(b, bestH, bestDevs, true)
	moved := bestH != old.host || !sameInts(bestDevs, old.devs)
	if !moved {
		r.reset(before)
	}
	return moved
}

func (r *run) trySwap(b, c int) bool {
	s := r.s
	ab, ac := r.a[b], r.a[c]
	if s.pinned[c].host >= 0 || ab.host == ac.host {
		return false
	}
	if len(s.cr.adj[b]) == 0 && len(s.cr.adj[c]) == 0 {
		return false
	}
	cur := r.score()
	before := r.mark()
	r.unplace(b, true)
	r.unplace(c, true)
	r.curMax()
	if r.swapInto(b, ac, c, ab) {
		if r.score().less(cur) {
			return true
		}
		r.unplace(b, true)
		r.unplace(c, true)
	}
	r.place(b, ab.host, ab.devs, true)
	r.place(c, ac.host, ac.devs, true)
	r.reset(before)
	return false
}

// swapInto places b where c was (tb) and c where b was (tc): on exactly
// those devices when the sizes match, else on devices picked afresh (so a
// two-device bundle can trade places with a one-device one). It reports
// false, with neither placed, when either does not fit. It expects a clean
// busiest load and leaves it clean.
func (r *run) swapInto(b int, tb asg, c int, tc asg) bool {
	base := r.mark()
	db, ok := r.devicesFor(b, tb)
	if !ok {
		return false
	}
	r.place(b, tb.host, db, true)
	dc, ok := r.devicesFor(c, tc)
	if !ok {
		r.unplace(b, true)
		r.reset(base)
		return false
	}
	r.place(c, tc.host, dc, true)
	return true
}

func (r *run) devicesFor(b int, at asg) ([]int, bool) {
	s := r.s
	need := s.cr.bundles[b].devices
	if len(at.devs) == need && r.fits(b, at.host, at.devs) {
		return at.devs, true
	}
	if r.hostFree(b, at.host) < 0 {
		return nil, false
	}
	d := s.pickDevices(b, at.host, r.sc.numa)
	if d == nil && need > 0 {
		return nil, false
	}
	return d, true
}

// tryEvict moves b onto a host of one of its traffic peers that has no
// room for it, by moving one bundle c of that host to c's best other
// place: a two-step move whose first step alone may not pay (a heavy pair
// can join only if a lighter bundle leaves its domain).
func (r *run) tryEvict(b int) bool {
	s := r.s
	n := len(s.cr.bundles)
	old := r.a[b]
	var peerHosts []int
	for _, ei := range s.cr.adj[b] {
		e := s.cr.edges[ei]
		o := e.from
		if o == b {
			o = e.to
		}
		if h := r.a[o].host; h >= 0 && h != old.host && !containsInt(peerHosts, h) {
			peerHosts = append(peerHosts, h)
		}
	}
	for _, h := range peerHosts {
		if r.hostFree(b, h) >= 0 && s.pickDevices(b, h, r.sc.numa) != nil {
			continue // a plain move covers it
		}
		for c := 0; c < n; c++ {
			ac := r.a[c]
			if c == b || ac.host != h || s.pinned[c].host >= 0 {
				continue
			}
			if r.evict(b, c) {
				return true
			}
		}
	}
	return false
}

// evict tries b onto c's host with c moved to its cheapest candidate
// host; it keeps the change only when the score drops.
func (r *run) evict(b, c int) bool {
	s := r.s
	ab, ac := r.a[b], r.a[c]
	cur := r.score()
	before := r.mark()
	r.unplace(b, true)
	r.unplace(c, true)
	r.curMax()
	db, ok := r.devicesFor(b, asg{host: ac.host})
	if ok {
		r.place(b, ac.host, db, true)
		mid := r.mark()
		bestH, bestDevs, best := -1, []int(nil), cur
		for _, h := range r.candidates(c) {
			devs := s.pickDevices(c, h, r.sc.numa)
			if devs == nil && s.cr.bundles[c].devices > 0 {
				continue
			}
			r.place(c, h, devs, true)
			if sc := r.score(); sc.less(best) {
				bestH, bestDevs, best = h, devs, sc
			}
			r.unplace(c, true)
			r.reset(mid)
		}
		if bestH >= 0 {
			r.place(c, bestH, bestDevs, true)
			return true
		}
		r.unplace(b, true)
	}
	r.place(b, ab.host, ab.devs, true)
	r.place(c, ac.host, ac.devs, true)
	r.reset(before)
	return false
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// fits checks that bundle b may take exactly devs on host h.
func (r *run) fits(b, h int, devs []int) bool {
	if r.hostFree(b, h) < 0 {
		return false
	}
	for _, d := range devs {
		if !r.s.u.available(h, d) || !r.s.devOK(b, h, d, r.sc.numa) {
			return false
		}
	}
	return true
}

func sameInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
