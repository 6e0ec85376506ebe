package sched

import (
	"fmt"
	"sort"
	"sync"

	"github.com/tensorlane/tensorlane/topology"
)

// Assignment is where one bundle goes: a host by ID and device indices of
// that host (topology.Device.Index), so that a runtime that claimed the
// host can spawn the bundle's actor on exactly these devices.
type Assignment struct {
	Bundle  int    `json:"bundle"`
	Host    string `json:"host"`
	Devices []int  `json:"devices"`
	// NUMA is the NUMA node all the devices share, or -1.
	NUMA int `json:"numa"`
}

// Placement is the scheduler's answer for a request.
type Placement struct {
	Feasible bool `json:"feasible"`
	// Reasons lists, when infeasible, every reason found.
	Reasons     []string     `json:"reasons"`
	Assignments []Assignment `json:"assignments"`
	// EstimatedSeconds is the cost model's time for one step of the
	// request's traffic (see Flow and CostModel); 0 without traffic.
	EstimatedSeconds float64 `json:"estimated_seconds"`
	// Span is the smallest level whose one group holds the whole gang
	// ("numa", "host", "nvlink-domain", ..., or "cluster"), and Group
	// that group's name.
	Span  string `json:"span,omitempty"`
	Group string `json:"group,omitempty"`
	// Notes explain choices: a preferred level that did not fit.
	Notes []string `json:"notes,omitempty"`
}

// Scheduler places requests on one cluster and keeps the state:
// reservations and failed hosts and devices. Its decisions are a pure
// function of (cluster, state, request, Config): no clock, no randomness,
// no map order. It is safe for concurrent use.
type Scheduler struct {
	mu   sync.Mutex
	ix   *index
	cfg  Config
	u    *usage
	res  map[string]*reservation
	next int
}

type reservation struct {
	id  string
	req Request
	cr  *creq
	a   []asg
}

// New returns a scheduler for the cluster with no reservations. The
// scheduler keeps the cluster; do not change it afterwards.
func New(c *topology.Cluster, cfg Config) (*Scheduler, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil cluster", ErrInvalidConfig)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	for _, h := range c.Hosts {
		if h == nil {
			return nil, fmt.Errorf("%w: nil host in cluster", ErrInvalidConfig)
		}
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ix := newIndex(c, cfg.Cost, cfg.noShapes)
	return &Scheduler{ix: ix, cfg: cfg, u: newUsage(ix), res: map[string]*reservation{}}, nil
}

// Place finds a placement for req without reserving it. An invalid request
// gives an error wrapping ErrInvalidRequest; an infeasible one gives a
// Placement with Feasible false and its Reasons, and an *InfeasibleError.
func (s *Scheduler) Place(req Request) (Placement, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, _, _, err := s.place(req, nil)
	return p, err
}

func (s *Scheduler) place(req Request, pinned []asg) (Placement, *creq, *result, error) {
	cr, err := compile(req)
	if err != nil {
		return Placement{Reasons: []string{}, Assignments: []Assignment{}}, nil, nil, err
	}
	sv := newSolver(s.ix, s.cfg, s.u, cr, pinned)
	res := sv.solve()
	if res == nil {
		reasons := s.diagnose(sv)
		return Placement{Reasons: reasons, Assignments: []Assignment{}}, cr, nil, &InfeasibleError{Reasons: reasons}
	}
	return s.toPlacement(cr, res), cr, res, nil
}

func (s *Scheduler) toPlacement(cr *creq, res *result) Placement {
	p := Placement{Feasible: true, Reasons: []string{}, EstimatedSeconds: res.cost}
	for b, x := range res.a {
		hi := &s.ix.hosts[x.host]
		devs := make([]int, len(x.devs))
		for i, d := range x.devs {
			devs[i] = hi.devs[d].index
		}
		p.Assignments = append(p.Assignments, Assignment{Bundle: b, Host: hi.id, Devices: devs, NUMA: res.numa[b]})
	}
	p.Span, p.Group = s.span(res.a)
	if cr.preferred >= 0 && res.achieved > cr.preferred {
		p.Notes = append(p.Notes, fmt.Sprintf("preferred %s could not hold the gang; placed within %s", levelByRank[cr.preferred], levelPhrase[res.achieved]))
	}
	return p
}

// span is the smallest level with one group holding every assignment.
func (s *Scheduler) span(a []asg) (string, string) {
	ix := s.ix
	h0 := a[0].host
	sameHost := true
	for _, x := range a {
		if x.host != h0 {
			sameHost = false
		}
	}
	if sameHost {
		nu, all := -2, true
		for _, x := range a {
			for _, d := range x.devs {
				dn := ix.hosts[h0].devs[d].numa
				if nu == -2 {
					nu = dn
				} else if dn != nu {
					all = false
				}
			}
		}
		if all && nu >= 0 && len(ix.hosts[h0].numas) > 1 {
			return string(LevelNUMA), ix.hosts[h0].id + "/numa" + itoa(nu)
		}
		return string(LevelHost), ix.hosts[h0].id
	}
	for r := rankNVLink; r < rankCluster; r++ {
		if !ix.labelled[r] {
			continue
		}
		g := ix.hosts[h0].group[r]
		one := true
		for _, x := range a {
			if ix.hosts[x.host].group[r] != g {
				one = false
				break
			}
		}
		if one && len(ix.groups[r][g].hosts) > 1 {
			return string(levelByRank[r]), ix.groups[r][g].name
		}
	}
	return "cluster", ""
}

// Reserve places req and holds its devices under id ("" picks "r1",
// "r2", ...). It returns the placement; the reservation exists only when
// the error is nil.
func (s *Scheduler) Reserve(id string, req Request) (Placement, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id == "" {
		for {
			s.next++
			id = "r" + itoa(s.next)
			if _, ok := s.res[id]; !ok {
				break
			}
		}
	} else if _, ok := s.res[id]; ok {
		return Placement{Reasons: []string{}, Assignments: []Assignment{}}, fmt.Errorf("%w: %q", ErrDuplicateReservation, id)
	}
	p, cr, res, err := s.place(req, nil)
	if err != nil {
		return p, err
	}
	rv := &reservation{id: id, req: req, cr: cr, a: res.a}
	s.hold(rv)
	s.res[id] = rv
	return p, nil
}

func (s *Scheduler) hold(rv *reservation) {
	for b, x := range rv.a {
		bd := &rv.cr.bundles[b]
		s.u.take(s.ix, x.host, x.devs, bd.cpuMilli, bundleHostMem(bd))
	}
}

func (s *Scheduler) unhold(rv *reservation, bundles []int) {
	for _, b := range bundles {
		x := rv.a[b]
		bd := &rv.cr.bundles[b]
		s.u.put(s.ix, x.host, x.devs, bd.cpuMilli, bundleHostMem(bd))
	}
}

func bundleHostMem(bd *cbundle) int64 {
	if bd.devices == 0 {
		return bd.memBytes
	}
	return 0
}

func allBundles(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// Release returns a reservation's devices.
func (s *Scheduler) Release(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rv, ok := s.res[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownReservation, id)
	}
	s.unhold(rv, allBundles(len(rv.a)))
	delete(s.res, id)
	return nil
}

// Reservation returns the current placement of a reservation.
func (s *Scheduler) Reservation(id string) (Placement, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rv, ok := s.res[id]
	if !ok {
		return Placement{}, false
	}
	return s.resPlacement(rv), true
}

func (s *Scheduler) resPlacement(rv *reservation) Placement {
	res := &result{a: rv.a, numa: make([]int, len(rv.a)), achieved: -1}
	for b, x := range rv.a {
		res.numa[b] = s.ix.commonNUMA(x.host, x.devs)
	}
	hosts := make([]int, len(rv.a))
	devs := make([][]int, len(rv.a))
	for b, x := range rv.a {
		hosts[b], devs[b] = x.host, x.devs
	}
	res.cost = s.ix.estimate(rv.cr, hosts, devs)
	return s.toPlacement(rv.cr, res)
}

func (s *Scheduler) sortedIDs() []string {
	ids := make([]string, 0, len(s.res))
	for id := range s.res {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Rescheduled reports what a failure did to one reservation.
type Rescheduled struct {
	ID string `json:"id"`
	// Moved lists the bundles that got a new place.
	Moved []int `json:"moved"`
	// Placement is the reservation's placement now; Feasible is false
	// (with Reasons) when it was evicted.
	Placement Placement `json:"placement"`
	// Evicted is true when no placement was found: the reservation is
	// gone and its devices are free.
	Evicted bool `json:"evicted,omitempty"`
}

// FailHost marks a host failed and reschedules every reservation with a
// bundle on it: first only the affected bundles, the others staying where
// they are; if that is impossible, the whole gang; if that is impossible
// too, the reservation is evicted. Reservations are handled in ID order.
func (s *Scheduler) FailHost(host string) ([]Rescheduled, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.ix.byID[host]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownHost, host)
	}
	s.u.failedHost[h] = true
	return s.rescheduleAffected(func(x asg) bool { return x.host == h }), nil
}

// FailDevice marks one device failed and reschedules the reservation that
// held it, as FailHost does.
func (s *Scheduler) FailDevice(host string, device int) ([]Rescheduled, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, d, err := s.lookupDevice(host, device)
	if err != nil {
		return nil, err
	}
	s.u.failDevice(s.ix, h, d)
	return s.rescheduleAffected(func(x asg) bool { return x.host == h && contains1(sortedCopy(x.devs), d) }), nil
}

// RestoreHost and RestoreDevice clear a failure; nothing moves back.
func (s *Scheduler) RestoreHost(host string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.ix.byID[host]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownHost, host)
	}
	s.u.failedHost[h] = false
	return nil
}

func (s *Scheduler) RestoreDevice(host string, device int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, d, err := s.lookupDevice(host, device)
	if err != nil {
		return err
	}
	s.u.restoreDevice(s.ix, h, d)
	return nil
}

func (s *Scheduler) lookupDevice(host string, device int) (int, int, error) {
	h, ok := s.ix.byID[host]
	if !ok {
		return 0, 0, fmt.Errorf("%w: %q", ErrUnknownHost, host)
	}
	d, ok := s.ix.hosts[h].pos[device]
	if !ok {
		return 0, 0, fmt.Errorf("%w: %s/%d", ErrUnknownDevice, host, device)
	}
	return h, d, nil
}

func sortedCopy(x []int) []int {
	y := append([]int(nil), x...)
	sortInts(y)
	return y
}

func (s *Scheduler) rescheduleAffected(hit func(asg) bool) []Rescheduled {
	out := []Rescheduled{}
	for _, id := range s.sortedIDs() {
		rv := s.res[id]
		var moved []int
		for b, x := range rv.a {
			if hit(x) {
				moved = append(moved, b)
			}
		}
		if len(moved) == 0 {
			continue
		}
		out = append(out, s.reschedule(rv, moved))
	}
	return out
}

func (s *Scheduler) reschedule(rv *reservation, moved []int) Rescheduled {
	s.unhold(rv, moved)
	pinned := make([]asg, len(rv.a))
	for b := range pinned {
		pinned[b] = rv.a[b]
	}
	for _, b := range moved {
		pinned[b] = asg{host: -1}
	}
	sv := newSolver(s.ix, s.cfg, s.u, rv.cr, pinned)
	if res := sv.solve(); res != nil {
		rv.a = res.a
		s.holdBundles(rv, moved)
		return Rescheduled{ID: rv.id, Moved: moved, Placement: s.resPlacement(rv)}
	}
	// The whole gang.
	var rest []int
	for b := range rv.a {
		if pinned[b].host >= 0 {
			rest = append(rest, b)
		}
	}
	s.unhold(rv, rest)
	sv = newSolver(s.ix, s.cfg, s.u, rv.cr, nil)
	if res := sv.solve(); res != nil {
		rv.a = res.a
		s.hold(rv)
		var all []int
		for b := range rv.a {
			all = append(all, b)
		}
		return Rescheduled{ID: rv.id, Moved: all, Placement: s.resPlacement(rv)}
	}
	reasons := s.diagnose(sv)
	delete(s.res, rv.id)
	return Rescheduled{ID: rv.id, Moved: []int{}, Evicted: true,
		Placement: Placement{Reasons: reasons, Assignments: []Assignment{}}}
}

func (s *Scheduler) holdBundles(rv *reservation, bundles []int) {
	for _, b := range bundles {
		x := rv.a[b]
		bd := &rv.cr.bundles[b]
		s.u.take(s.ix, x.host, x.devs, bd.cpuMilli, bundleHostMem(bd))
	}
}
