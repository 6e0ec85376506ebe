package bcastrun

import (
	"context"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

// A writer learns each generation a reader is done with, never goes back,
// and forgets a dead reader's slots.
func TestGens(t *testing.T) {
	var g Gens
	a, b := peer.ID("a"), peer.ID("b")
	slot := fabric.ObjectID{1}
	got, changed := g.State(Key{a, slot})
	assert.Zero(t, got)
	g.Consumed(a, slot, 2)
	select {
	case <-changed:
	default:
		t.Fatal("a change is announced")
	}
	g.Consumed(a, slot, 1) // late and older: ignored
	g.Consumed(b, slot, 5)
	got, _ = g.State(Key{a, slot})
	assert.Equal(t, uint64(2), got)
	g.Forget(b)
	got, _ = g.State(Key{b, slot})
	assert.Zero(t, got)
}

// Input a broadcast cannot start with is refused before anything is
// pinned or sent (the owner has no Env calls to make).
func TestBroadcastRefusesBadInput(t *testing.T) {
	o := NewOwner(Deps{})
	one := []Ref{{}}
	for name, tc := range map[string]struct {
		srcs    []Ref
		readers [][]Ref
		cfg     bcast.Config
	}{
		"no readers":       {one, nil, bcast.Config{}},
		"no objects":       {nil, [][]Ref{{}}, bcast.Config{}},
		"slots per reader": {one, [][]Ref{{{}, {}}}, bcast.Config{}},
		"tiny chunks":      {one, [][]Ref{one}, bcast.Config{ChunkSize: 1}},
		"window too large": {one, [][]Ref{one}, bcast.Config{Window: bcast.MaxWindow + 1}},
		"too many objects": {make([]Ref, bcast.MaxItems+1), [][]Ref{make([]Ref, bcast.MaxItems+1)}, bcast.Config{}},
	} {
		_, err := o.Broadcast(context.Background(), tc.srcs, tc.readers, tc.cfg, nil)
		assert.ErrorIs(t, err, errs.MalformedRef, name)
	}
}
