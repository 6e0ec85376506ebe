package bcast

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// An edge window runs up to w writes at once, in the order they are sent;
// the first failure stops it and is the one it reports.
func TestEdgeWindow(t *testing.T) {
	t.Run("bounded", func(t *testing.T) {
		w := NewWindow(context.Background(), 3)
		gate := make(chan struct{})
		var running, most atomic.Int64
		write := func(ctx context.Context) error {
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-gate
			running.Add(-1)
			return nil
		}
		sent := make(chan bool)
		go func() {
			for range 5 {
				if !w.Send(write) {
					sent <- false
					return
				}
			}
			sent <- true
		}()
		require.Eventually(t, func() bool { return running.Load() == 3 }, 10*time.Second, time.Millisecond)
		close(gate)
		require.True(t, <-sent)
		ok, err := w.Wait()
		assert.NoError(t, err)
		assert.Equal(t, 5, ok)
		assert.Equal(t, int64(3), most.Load(), "never more than the window")
	})
	t.Run("first failure", func(t *testing.T) {
		w := NewWindow(context.Background(), 2)
		boom := errors.New("boom")
		held := make(chan struct{})
		require.True(t, w.Send(func(ctx context.Context) error {
			close(held)
			<-ctx.Done() // cancelled by the failure next door
			return ctx.Err()
		}))
		<-held
		require.True(t, w.Send(func(context.Context) error { return boom }))
		<-w.Done()
		assert.False(t, w.Send(func(context.Context) error { t.Error("started after a failure"); return nil }))
		ok, err := w.Wait()
		assert.ErrorIs(t, err, boom)
		assert.Zero(t, ok)
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		w := NewWindow(ctx, 2)
		require.True(t, w.Send(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }))
		cancel()
		assert.False(t, w.Send(func(context.Context) error { return nil }))
		ok, err := w.Wait()
		assert.NoError(t, err, "the caller's cancellation is not the edge's failure")
		assert.Zero(t, ok)
	})
	t.Run("reuses its workers", func(t *testing.T) {
		w := NewWindow(context.Background(), 2)
		var done atomic.Int64
		for range 1000 {
			require.True(t, w.Send(func(context.Context) error { done.Add(1); return nil }))
		}
		ok, err := w.Wait()
		require.NoError(t, err)
		assert.Equal(t, 1000, ok)
		assert.Equal(t, int64(1000), done.Load())
		assert.LessOrEqual(t, w.workers, 2, "a goroutine per place, not per write")
		goleak.VerifyNone(t) // Wait ended them
	})
}
