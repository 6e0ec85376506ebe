// Package faults is the seam through which fabric/rdma's tests make a
// provider misbehave on the wire, so that the transport's checks are seen
// to catch it. A provider's Config carries a *Sim; nil, which is all code
// outside this module can set (the type is internal), is a healthy
// provider. It holds no test code: the tests decide when a fault takes
// hold, the providers only ask.
package faults

import "sync/atomic"

// Sim is a provider's simulated faults.
type Sim struct {
	corrupt atomic.Bool
}

// CorruptNext makes the next frame the provider sends as an owner arrive
// damaged (which part a provider can damage is its own: softrdma flips a
// payload bit after the checksum, ofi cuts a control answer short).
func (s *Sim) CorruptNext() { s.corrupt.Store(true) }

// TakeCorrupt says whether the frame being sent is the one to damage,
// consuming the fault; always false on a nil Sim.
func (s *Sim) TakeCorrupt() bool { return s != nil && s.corrupt.CompareAndSwap(true, false) }
