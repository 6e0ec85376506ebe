package rdt

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/bcastrun"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
)

// Each edge of the tree keeps Window chunks in flight, no more: the owner
// feeding h1's reader, and h1's reader forwarding to h2's. Chunk notices
// to a runtime are held (a test hook) so the writer fills its window.
func TestBroadcastWindow(t *testing.T) {
	for _, window := range []int{1, 4, MaxBroadcastWindow} {
		t.Run(fmt.Sprintf("window=%d", window), func(t *testing.T) {
			ctx := context.Background()
			f := newFleet(t, 2<<20+5, 1) // 33 chunks of 64 KiB
			refs := f.refs()[1:3]        // h1's reader, then h2's (fed by h1's)
			h1, h2 := f.rts[1], f.rts[2]
			hold1, hold2 := make(chan struct{}), make(chan struct{})
			h1.faults.Hold.Store(&hold1)
			h2.faults.Hold.Store(&hold2)
			release := func(r *Runtime, c chan struct{}) {
				if r.faults.Hold.Swap(nil) != nil {
					close(c)
				}
			}
			t.Cleanup(func() { release(h1, hold1); release(h2, hold2) }) // a failed test does not hang
			h := f.owner.StartBroadcast(ctx, f.src, refs, BroadcastConfig{ChunkSize: bcast.MinChunk, Window: window})
			require.Eventually(t, func() bool { return h1.faults.Held.Load() == int64(window) }, 20*time.Second, time.Millisecond, "the owner's edge fills its window")
			release(h1, hold1)
			require.Eventually(t, func() bool { return h2.faults.Held.Load() == int64(window) }, 20*time.Second, time.Millisecond, "the forward fills its window")
			release(h2, hold2)
			res, err := h.Await(ctx)
			require.NoError(t, err)
			require.NoError(t, res.Err())
			assert.Equal(t, 0, res.Readers[1].FedBy, "h2 is fed by h1's reader")
			assert.Equal(t, int64(window), h1.faults.HeldMax.Load(), "never more than the window")
			assert.Equal(t, int64(window), h2.faults.HeldMax.Load(), "never more than the window")
			checkSlot(t, f.slots[1], 0, f.data)
			checkSlot(t, f.slots[2], 0, f.data)
			assert.Equal(t, Progress{Done: 2 * res.Bytes, Total: 2 * res.Bytes}, h.Progress())
		})
	}
}

// A window out of range fails the call at once; a reader refuses a
// prepare whose window is out of range.
func TestBroadcastWindowBad(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 1<<20, 1)
	for _, w := range []int{-1, MaxBroadcastWindow + 1} {
		_, err := f.owner.Broadcast(ctx, f.src, f.refs(), BroadcastConfig{Window: w})
		assert.ErrorIs(t, err, ErrMalformedRef, "window %d", w)
	}
	s := f.slots[1].Ref()
	err := f.rts[1].onBcast(f.rts[0].host.ID(), bcastrun.Msg{Kind: ctlwire.Prepare, Slot: s.Object, Inc: s.Incarnation, Token: s.Token,
		N: 1 << 20, Off: bcast.MinChunk, Gen: MaxBroadcastWindow + 1})
	assert.ErrorIs(t, err, ErrMalformedRef)
	// Nothing was taken: the slot still takes a broadcast.
	res, err := f.owner.Broadcast(ctx, f.src, f.refs(), BroadcastConfig{Window: 2})
	require.NoError(t, err)
	require.NoError(t, res.Err())
	checkSlot(t, f.slots[1], 0, f.data)
}
