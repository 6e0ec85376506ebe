package rdma

import (
	"strings"
	"time"
)

// Degrade marks the rails from the local NIC nic to the owner NIC at addr
// (the address a queue pair dialed) as degraded for d: link telemetry
// (fabric/linkstat) saw the connection under them queue or drop. A
// degraded rail keeps its queue pair and finishes the slices it has in
// flight, but gets no new slice while another rail of the transfer can
// take one; when every rail is degraded they all still carry it. The mark
// ends at Recover or after d, whichever comes first, so a rail whose
// telemetry goes quiet (no traffic, no new samples) is tried again. An
// empty nic or addr matches any. It returns the labels of the rails
// marked; the first mark of a rail is logged (Warn) and counted
// (tensorlane_rail_health_pauses_total{rail}), a renewal is not.
func (t *Transport) Degrade(nic, addr string, d time.Duration, reason string) []string {
	now := t.cfg.Clock.Now()
	var marked, fresh []string
	for _, r := range t.matching(nic, addr) {
		r.mu.Lock()
		was := now.Before(r.degradedUntil)
		r.degradedUntil, r.degradedReason = now.Add(d), reason
		r.mu.Unlock()
		marked = append(marked, r.label)
		if !was {
			fresh = append(fresh, r.label)
			t.log.Warn("rdma rail degraded: no new slices while another rail can take them", "rail", r.label,
				"owner", r.peer, "addr", r.remote.Addr, "for", d, "reason", reason)
			if m := t.cfg.Metrics; m != nil && m.HealthPauses != nil {
				m.HealthPauses.WithLabelValues(r.label).Inc()
			}
		}
	}
	if len(fresh) > 0 {
		t.mu.Lock()
		if !t.closed {
			t.broadcastLocked()
		}
		t.mu.Unlock()
	}
	return marked
}

// Recover clears Degrade's mark on the matching rails (logged when one was
// marked) and returns the labels of those that were degraded.
func (t *Transport) Recover(nic, addr string) []string {
	now := t.cfg.Clock.Now()
	var out []string
	for _, r := range t.matching(nic, addr) {
		r.mu.Lock()
		was := now.Before(r.degradedUntil)
		r.degradedUntil, r.degradedReason = time.Time{}, ""
		r.mu.Unlock()
		if was {
			out = append(out, r.label)
			t.log.Info("rdma rail recovered: takes slices again", "rail", r.label, "owner", r.peer, "addr", r.remote.Addr)
		}
	}
	if len(out) > 0 {
		t.mu.Lock()
		if !t.closed {
			t.broadcastLocked()
		}
		t.mu.Unlock()
	}
	return out
}

// matching returns the rails from local NIC nic to the owner address addr.
// Addresses compare as dialed; "" matches any.
func (t *Transport) matching(nic, addr string) []*rail {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*rail
	for _, r := range t.rails {
		if (nic == "" || r.local.name == nic) && (addr == "" || strings.EqualFold(r.remote.Addr, addr)) {
			out = append(out, r)
		}
	}
	return out
}
