// Package faults is the seam through which rdt's tests simulate a
// runtime's failures without a real crash: a hung process, reads that
// stall while the control channel answers, a reader that dies holding
// leases. The Runtime reads one Sim at the few points a fault takes hold
// (answering heartbeats, opening an object for a read, releasing leases at
// Shutdown, a relay taking a broadcast's chunk); nothing outside tests sets
// it, so its zero value is a healthy runtime.
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
	// DropChunks: the runtime's broadcast slots take only the first chunk
	// of a broadcast (the rest are acknowledged and dropped), so a reader
	// is mid-transfer for as long as a test needs.
	DropChunks atomic.Bool
	// Hold: chunk notices to the runtime's slots wait while it is set
	// (until the channel is closed), so a test sees how many chunks a
	// writer keeps in flight: Held counts those waiting, HeldMax the most
	// at once.
	Hold    atomic.Pointer[chan struct{}]
	Held    atomic.Int64
	HeldMax atomic.Int64
}

// ReadsBlocked says whether a read must hang.
func (s *Sim) ReadsBlocked() bool { return s.Hung.Load() || s.StallReads.Load() }

// HoldChunk waits while Hold is set, counting itself in Held.
func (s *Sim) HoldChunk() {
	h := s.Hold.Load()
	if h == nil {
		return
	}
	n := s.Held.Add(1)
	for m := s.HeldMax.Load(); n > m && !s.HeldMax.CompareAndSwap(m, n); m = s.HeldMax.Load() {
	}
	<-*h
	s.Held.Add(-1)
}
