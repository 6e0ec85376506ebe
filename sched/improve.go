package sched

// improve is a bounded local search after the greedy pass, for gangs with
// traffic of at most Config.LocalSearch bundles: move a bundle to another
// candidate host, or swap the places of two bundles of equal size, when
// that strictly lowers (busiest resource, summed busy time). SPREAD keeps
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
			for c := 0; c < n && r.work < budget; c++ {
				if c != b && r.trySwap(b, c) {
					improved = true
				}
			}
		}
		if !improved {
			return
		}
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

func (r *run) tryMove(b int) bool {
	s := r.s
	old := r.a[b]
	cur := r.score()
	r.unplace(b, true)
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
	}
	r.place(b, bestH, bestDevs, true)
	return bestH != old.host || !sameInts(bestDevs, old.devs)
}

func (r *run) trySwap(b, c int) bool {
	s := r.s
	ab, ac := r.a[b], r.a[c]
	if s.pinned[c].host >= 0 || ab.host == ac.host || len(ab.devs) != len(ac.devs) {
		return false
	}
	if len(s.cr.adj[b]) == 0 && len(s.cr.adj[c]) == 0 {
		return false
	}
	cur := r.score()
	r.unplace(b, true)
	r.unplace(c, true)
	if r.fits(b, ac.host, ac.devs) && r.fits(c, ab.host, ab.devs) {
		r.place(b, ac.host, ac.devs, true)
		r.place(c, ab.host, ab.devs, true)
		if r.score().less(cur) {
			return true
		}
		r.unplace(b, true)
		r.unplace(c, true)
	}
	r.place(b, ab.host, ab.devs, true)
	r.place(c, ac.host, ac.devs, true)
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
