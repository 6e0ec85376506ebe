package bcastrun

import (
	"context"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
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

// Wait returns once the reader is done with the generation, and says why
// when it will not be.
func TestGensWait(t *testing.T) {
	a := peer.ID("a")
	k := Key{a, fabric.ObjectID{1}}
	never := make(chan struct{})
	closed := make(chan struct{})
	close(closed)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name          string
		ctx           context.Context
		gen           uint64
		death, closed <-chan struct{}
		want          error // nil: done
	}{
		{"done with it", context.Background(), 2, never, never, nil},
		{"reader died", context.Background(), 3, closed, never, errs.ReaderDied},
		{"runtime shut down", context.Background(), 3, never, closed, errs.Closed},
		{"ctx done", cancelled, 3, never, never, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g Gens
			g.Consumed(a, k.Slot, 2)
			err := g.Wait(tc.ctx, k, tc.gen, tc.death, tc.closed)
			if tc.want == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, tc.want)
			}
		})
	}
	var g Gens
	done := make(chan error)
	go func() { done <- g.Wait(context.Background(), k, 1, never, never) }()
	g.Consumed(a, k.Slot, 1)
	assert.NoError(t, <-done, "a later Consumed ends the wait")
}

// Handle routes a reader's Consumed to the owner's generations and
// refuses a kind it does not know; ParseMsg names bad bytes MalformedRef.
func TestHandle(t *testing.T) {
	o, rs := NewOwner(Deps{}), NewRelays(RelayDeps{})
	slot := fabric.ObjectID{1}
	assert.NoError(t, Handle(o, rs, "a", Msg{Kind: ctlwire.Consumed, Slot: slot, Gen: 4}))
	got, _ := o.Gens.State(Key{"a", slot})
	assert.Equal(t, uint64(4), got)
	assert.ErrorIs(t, Handle(o, rs, "a", Msg{Kind: 0xEE}), errs.MalformedRef)
	_, err := ParseMsg([]byte{0xEE, 1, 2})
	assert.ErrorIs(t, err, errs.MalformedRef)
}
