// Package bcastrun runs broadcasts: the owner's side (Owner: the readers'
// tree, feeding the first chunks, following reports, re-parenting orphans,
// the writer's table of generations its readers are done with, Gens), the
// readers' side (Relays: a relay fills a runtime's slots, objstore.Slot,
// and forwards each chunk that lands to its children), and the chunk write
// both make (WriteChunk). It needs no runtime: what it asks of one is Env, a handful
// of methods rdt's Runtime implements (rdt/bcastwire.go) over its control
// channel, its planner and its failure detector. The pure parts (planner,
// tree, windows, chunk numbering, notice codec, metrics) are package bcast.
package bcastrun

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// WriteFunc writes src into a slot at off (Env.Edge).
type WriteFunc func(ctx context.Context, src tensor.Buffer, off int64) error

// Ref is a ref as the engine names it: rdt.Ref's fields.
type Ref = refwire.Ref

// Msg is every broadcast notice.
type Msg = bcast.Msg[Ref]

// Env is what a broadcast needs of the runtime it runs in.
type Env interface {
	// Self is this runtime's peer and incarnation.
	Self() (peer.ID, uint64)
	// Closed says the runtime is shutting down; Done is closed then.
	Closed() bool
	Done() <-chan struct{}
	// Send delivers a broadcast notice to runtime to (this one included)
	// and returns the condition it was answered with.
	Send(ctx context.Context, to peer.ID, m Msg) error
	// Edge returns what writes chunks from memory on device dev into
	// dst's slot: each call writes src (a window of a pinned buffer) at
	// [off, off+src.Len()) over the best path that can push, the path
	// planned once for the edge rather than for every chunk.
	Edge(dev tensor.DeviceID, dst Ref) WriteFunc
	// EdgePath is the transport a write from from's memory into slot to
	// would take, or "none".
	EdgePath(from, to Ref) string
	// Watch returns a channel closed when incarnation inc of peer id is
	// declared dead, watched until unwatch.
	Watch(id peer.ID, inc uint64) (death <-chan struct{}, unwatch func())
	// Learn remembers a ref's control addresses, to reach its owner.
	Learn(ref Ref)
}
