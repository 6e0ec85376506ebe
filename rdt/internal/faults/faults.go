// Package faults is the seam through which rdt's tests simulate a
// runtime's failures without a real crash: a hung process, reads that
// stall while the control channel answers, a reader that dies holding
// leases. The Runtime reads one Sim at the few points a fault takes hold
// (answering heartbeats, opening an object for a read, releasing leases at
// Shutdown); nothing outside tests sets it, so its zero value is a healthy
// runtime.
package faults

import "sync/atomic"

// Sim is a runtime's simulated faults.
type Sim struct {
	// Hung: the runtime stops answering heartbeats and serving reads
	// without closing anything.
	Hung atomic.Bool
	// StallReads: reads hang while the control channel answers.
	StallReads atomic.Bool
	// AbandonHolds: Shutdown skips releasing the leases the runtime
	// holds, as a crashed reader would.
	AbandonHolds atomic.Bool
}

// ReadsBlocked says whether a read must hang.
func (s *Sim) ReadsBlocked() bool { return s.Hung.Load() || s.StallReads.Load() }
