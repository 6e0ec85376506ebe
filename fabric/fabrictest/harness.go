// Package fabrictest is the conformance suite every fabric.Transport runs,
// the way go-libp2p's transport test suite is run by every libp2p transport.
//
// A transport package calls Run from one of its tests with a Harness that
// starts its owner side (server) over the suite's object store and returns
// its reader side:
//
//	func TestConformance(t *testing.T) {
//		fabrictest.Run(t, fabrictest.Harness{Name: "tcp", Setup: setupTCP})
//	}
//
// The suite checks sizes from 0 bytes to 1 GiB (byte for byte), sub-ranges,
// 64 concurrent transfers, cancellation and the owner closing mid-transfer,
// an owner that stalls, a corrupted frame, forged tokens, stale
// incarnations, unknown objects, push (for transports that implement
// fabric.Writer; gathered pushes of runs for fabric.GatherWriter) and
// batches (for fabric.BatchReader: mixed valid, freed,
// unknown and forged objects, a cancelled batch, the owner closing or
// stalling mid-batch; the same for fabric.BatchWriter's push batches, with
// closed, unknown and forged sinks). Every case must end in success with the right bytes or in
// a typed error (errors.Is against the fabric sentinels) within a bounded
// time, with every pin the owner handed out released and no goroutine left
// behind once the harness has cleaned up.
//
// A transport that listens for data connections also runs RunAbuse with an
// AbuseHarness: garbage, oversized length fields, half handshakes, idle
// authenticated connections, floods past the connection caps and past the
// fd limit, and a peer that reads nothing (see docs/listeners.md).
package fabrictest

import (
	"context"
	"testing"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Harness adapts one transport to the suite.
type Harness struct {
	// Name names the transport in test output.
	Name string
	// Setup starts an owner that serves reads from src and pushes into sink,
	// and a reader-side transport that reaches it. It registers its own
	// cleanup with t.Cleanup; after cleanup no goroutine of the transport may
	// remain.
	Setup func(t testing.TB, src fabric.Source, sink fabric.Sink) Env
	// MaxSize is the largest transfer the suite tries; default 1 GiB. Lower
	// it only for transports whose medium cannot carry that much, and say why.
	MaxSize int64
	// InProcess says the reader copies straight out of the owner's memory
	// in one process (fabric/local): no frame or mapping lies between them
	// that could be corrupted, so Env.Corrupt may be nil and the suite then
	// skips CorruptFrame, saying why.
	InProcess bool
}

// Env is one connected owner and reader.
type Env struct {
	// Reader is the transport under test, on the reader's side. When it
	// implements fabric.Writer the suite also pushes through it.
	Reader fabric.Transport
	// Remote addresses the owner: Endpoint, Peer and Addrs are filled in;
	// the suite sets Claim, Offset and Length for each transfer.
	Remote fabric.Remote
	// Dst is the endpoint of the reader's buffers.
	Dst fabric.Endpoint
	// Alloc allocates reader-side destination memory. Default: a simulated
	// device arena of the suite's (host-visible and exportable).
	Alloc func(ctx context.Context, n int64) (tensor.Buffer, error)
	// CloseOwner stops the owner abruptly, dropping its connections and
	// mappings as a dying peer would. Required.
	CloseOwner func()
	// Corrupt makes the owner corrupt what it sends for the next transfer
	// (a data chunk, or the control reply for transports that move data
	// through shared mappings). Required: the suite checks that corruption
	// is detected, never delivered as data. May be nil only for an
	// InProcess harness.
	Corrupt func()
}
