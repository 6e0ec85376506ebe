package objstore

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

type filler struct{ cause error }

func (f *filler) Abort(cause error) { f.cause = cause }

// A flow-controlled slot takes no write from the moment a generation
// completes until its reader is done with it; a closed one takes none.
func TestSlotFlowControl(t *testing.T) {
	ctx := context.Background()
	buf, err := tensor.NewHostMemory(1<<20).Alloc(ctx, 64)
	require.NoError(t, err)
	s := NewSlot(buf, tensor.NewDesc(tensor.Uint8, 64))
	s.Flow = true
	tab := NewSinks(3)
	tab.Add(s)
	claim := fabric.Claim{Object: s.ID, Incarnation: 3, Token: s.Token}
	p, err := tab.OpenSink(ctx, claim)
	require.NoError(t, err)
	require.NoError(t, p.Release())
	assert.Equal(t, uint64(1), s.CompletedBy("writer"))
	_, err = tab.OpenSink(ctx, claim)
	assert.ErrorIs(t, err, errs.SlotBusy)
	_, err = s.Fill(&filler{})
	assert.ErrorIs(t, err, errs.SlotBusy, "a broadcast is a write too")
	writer, err := s.Consume(1)
	require.NoError(t, err)
	assert.Equal(t, "writer", string(writer))
	_, err = s.Consume(2)
	assert.ErrorIs(t, err, errs.MalformedRef, "done with a generation the slot has not reached")

	f := &filler{}
	old, err := s.Fill(f)
	require.NoError(t, err)
	assert.Nil(t, old)
	assert.True(t, s.Pinned(), "the relay reads the slot")
	require.NoError(t, tab.CloseSlot(s))
	assert.ErrorIs(t, f.cause, errs.ObjectFreed, "closing aborts the broadcast filling it")
	s.Unfill(f, f.cause, false)
	assert.False(t, s.Pinned())
	_, err = tab.OpenSink(ctx, claim)
	assert.ErrorIs(t, err, errs.ObjectNotFound)
	_, _, closed, _ := s.State()
	assert.True(t, closed)
	require.NoError(t, tab.CloseSlot(s), "idempotent")
}

// Wait returns the count once a push completed past after, and says why
// when none will.
func TestSlotWait(t *testing.T) {
	ctx := context.Background()
	buf, err := tensor.NewHostMemory(1<<20).Alloc(ctx, 64)
	require.NoError(t, err)
	s := NewSlot(buf, tensor.NewDesc(tensor.Uint8, 64))
	tab := NewSinks(3)
	tab.Add(s)
	never := make(chan struct{})
	done := make(chan uint64)
	go func() {
		n, err := s.Wait(ctx, 0, never)
		assert.NoError(t, err)
		done <- n
	}()
	s.CompletedBy("writer")
	assert.Equal(t, uint64(1), <-done)
	n, err := s.Wait(ctx, 0, never)
	require.NoError(t, err, "a count past after returns at once")
	assert.Equal(t, uint64(1), n)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.Wait(cctx, 1, never)
	assert.ErrorIs(t, err, context.Canceled)
	shut := make(chan struct{})
	close(shut)
	_, err = s.Wait(ctx, 1, shut)
	assert.ErrorIs(t, err, errs.Closed)
	require.NoError(t, tab.CloseSlot(s))
	_, err = s.Wait(ctx, 1, never)
	assert.ErrorIs(t, err, errs.ObjectFreed)
}
