package sched

import (
	"fmt"

	"github.com/tensorlane/tensorlane/topology"
)

// State is the scheduler's state as JSON: reservations and failures.
type State struct {
	Reservations  []Reservation       `json:"reservations,omitempty"`
	FailedHosts   []string            `json:"failed_hosts,omitempty"`
	FailedDevices []topology.Endpoint `json:"failed_devices,omitempty"`
}

// Reservation is a placed request holding its devices.
type Reservation struct {
	ID          string       `json:"id"`
	Request     Request      `json:"request"`
	Assignments []Assignment `json:"assignments"`
}

// State returns a copy of the current state: reservations by ID, failures
// in cluster order.
func (s *Scheduler) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st State
	for _, id := range s.sortedIDs() {
		rv := s.res[id]
		st.Reservations = append(st.Reservations, Reservation{ID: id, Request: rv.req, Assignments: s.resPlacement(rv).Assignments})
	}
	for h, hi := range s.ix.hosts {
		if s.u.failedHost[h] {
			st.FailedHosts = append(st.FailedHosts, hi.id)
		}
		for d, dv := range hi.devs {
			if s.u.failedDev[h][d] {
				st.FailedDevices = append(st.FailedDevices, topology.Endpoint{Host: hi.id, Device: dv.index})
			}
		}
	}
	return st
}

// Restore replaces the scheduler's state. The state must fit the cluster:
// known hosts and devices, valid requests, one assignment per bundle that
// satisfies the bundle, no device held twice. Errors wrap ErrInvalidState
// and leave the scheduler as it was.
func (s *Scheduler) Restore(st State) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := newUsage(s.ix)
	res := map[string]*reservation{}
	for _, name := range st.FailedHosts {
		h, ok := s.ix.byID[name]
		if !ok {
			return fmt.Errorf("%w: failed host %q is not in the cluster", ErrInvalidState, name)
		}
		u.failedHost[h] = true
	}
	for _, e := range st.FailedDevices {
		h, d, err := s.lookupDevice(e.Host, e.Device)
		if err != nil {
			return fmt.Errorf("%w: failed device: %w", ErrInvalidState, err)
		}
		u.failDevice(s.ix, h, d)
	}
	for i, r := range st.Reservations {
		if r.ID == "" {
			return fmt.Errorf("%w: reservation %d has no ID", ErrInvalidState, i)
		}
		if _, dup := res[r.ID]; dup {
			return fmt.Errorf("%w: duplicate reservation %q", ErrInvalidState, r.ID)
		}
		cr, err := compile(r.Request)
		if err != nil {
			return fmt.Errorf("%w: reservation %q: %w", ErrInvalidState, r.ID, err)
		}
		if len(r.Assignments) != len(cr.bundles) {
			return fmt.Errorf("%w: reservation %q: %d assignments for %d bundles", ErrInvalidState, r.ID, len(r.Assignments), len(cr.bundles))
		}
		rv := &reservation{id: r.ID, req: r.Request, cr: cr, a: make([]asg, len(cr.bundles))}
		seen := make([]bool, len(cr.bundles))
		for _, a := range r.Assignments {
			if a.Bundle < 0 || a.Bundle >= len(seen) || seen[a.Bundle] {
				return fmt.Errorf("%w: reservation %q: bad or repeated bundle %d", ErrInvalidState, r.ID, a.Bundle)
			}
			seen[a.Bundle] = true
			h, ok := s.ix.byID[a.Host]
			if !ok {
				return fmt.Errorf("%w: reservation %q: unknown host %q", ErrInvalidState, r.ID, a.Host)
			}
			bd := &cr.bundles[a.Bundle]
			if len(a.Devices) != bd.devices {
				return fmt.Errorf("%w: reservation %q: bundle %d has %d devices, wants %d", ErrInvalidState, r.ID, a.Bundle, len(a.Devices), bd.devices)
			}
			x := asg{host: h}
			for _, di := range a.Devices {
				d, ok := s.ix.hosts[h].pos[di]
				if !ok {
					return fmt.Errorf("%w: reservation %q: unknown device %s/%d", ErrInvalidState, r.ID, a.Host, di)
				}
				if u.used[h][d] {
					return fmt.Errorf("%w: reservation %q: device %s/%d is held twice", ErrInvalidState, r.ID, a.Host, di)
				}
				x.devs = append(x.devs, d)
				u.used[h][d] = true // marks duplicates within this reservation too
			}
			for _, d := range x.devs {
				u.used[h][d] = false
			}
			u.take(s.ix, h, x.devs, bd.cpuMilli, bundleHostMem(bd))
			rv.a[a.Bundle] = x
		}
		res[r.ID] = rv
	}
	s.u, s.res = u, res
	s.next = 0
	return nil
}
