package kit

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeConn struct {
	key    string
	closed atomic.Bool
}

func (c *fakeConn) Close() error { c.closed.Store(true); return nil }

type rig struct {
	pool         *Pool[string, *fakeConn]
	dials, waits atomic.Int32
	fail         atomic.Bool
}

func newRig(maxConns, maxIdle int, idle time.Duration) *rig {
	r := &rig{}
	r.pool = NewPool(PoolConfig[string, *fakeConn]{
		MaxConns: maxConns, MaxIdle: maxIdle, IdleTimeout: idle,
		Dial: func(ctx context.Context, k string) (*fakeConn, error) {
			if r.fail.Load() {
				return nil, fabric.ErrPeerClosed
			}
			return &fakeConn{key: k}, ctx.Err()
		},
		OnDial: func() { r.dials.Add(1) },
		OnWait: func() { r.waits.Add(1) },
	})
	return r
}

func TestPoolReuse(t *testing.T) {
	r := newRig(2, 0, 0)
	defer r.pool.Close()
	ctx := context.Background()
	a, pooled, err := r.pool.Get(ctx, "o")
	require.NoError(t, err)
	assert.False(t, pooled, "a fresh connection")
	r.pool.Put(a)
	b, pooled, err := r.pool.Get(ctx, "o")
	require.NoError(t, err)
	assert.True(t, pooled)
	assert.Same(t, a, b, "the idle connection is reused")
	c, _, err := r.pool.Get(ctx, "other")
	require.NoError(t, err)
	assert.NotSame(t, a, c, "keys have their own connections")
	assert.EqualValues(t, 2, r.dials.Load())
	open, idle, all := r.pool.Stats("o")
	assert.Equal(t, []int{1, 0, 2}, []int{open, idle, all})

	r.pool.Discard(b)
	assert.True(t, b.closed.Load())
	open, _, all = r.pool.Stats("o")
	assert.Equal(t, []int{0, 1}, []int{open, all}, "the slot is free and the key forgotten")
}

// TestPoolQueue: past MaxConns a Get waits for the first connection given
// back, oldest waiter first; a discarded connection hands its slot over
// (the waiter dials); ctx ends a wait.
func TestPoolQueue(t *testing.T) {
	r := newRig(1, 0, 0)
	defer r.pool.Close()
	ctx := context.Background()
	a, _, err := r.pool.Get(ctx, "o")
	require.NoError(t, err)

	got := make(chan *fakeConn)
	go func() {
		c, pooled, err := r.pool.Get(ctx, "o")
		assert.NoError(t, err)
		assert.True(t, pooled)
		got <- c
	}()
	require.Eventually(t, func() bool { return r.waits.Load() == 1 }, 5*time.Second, time.Millisecond)
	r.pool.Put(a)
	assert.Same(t, a, <-got, "handed to the waiter, not parked idle")

	go func() {
		c, pooled, err := r.pool.Get(ctx, "o")
		assert.NoError(t, err)
		assert.False(t, pooled, "a slot, dialed fresh")
		got <- c
	}()
	require.Eventually(t, func() bool { return r.waits.Load() == 2 }, 5*time.Second, time.Millisecond)
	r.pool.Discard(a)
	b := <-got
	assert.NotSame(t, a, b)

	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, _, err = r.pool.Get(cctx, "o")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	r.pool.Put(b)
	open, idle, _ := r.pool.Stats("o")
	assert.Equal(t, []int{1, 1}, []int{open, idle}, "the cancelled waiter took nothing")
}

func TestPoolIdle(t *testing.T) {
	r := newRig(4, 1, time.Nanosecond)
	defer r.pool.Close()
	ctx := context.Background()
	a, _, _ := r.pool.Get(ctx, "o")
	b, _, _ := r.pool.Get(ctx, "o")
	r.pool.Put(a)
	r.pool.Put(b) // past MaxIdle: closed; and a has been idle too long
	assert.True(t, b.closed.Load(), "past MaxIdle")
	assert.True(t, a.closed.Load(), "idle past IdleTimeout")
	open, idle, all := r.pool.Stats("o")
	assert.Equal(t, []int{0, 0, 0}, []int{open, idle, all})
}

func TestPoolDialError(t *testing.T) {
	r := newRig(1, 0, 0)
	defer r.pool.Close()
	r.fail.Store(true)
	_, _, err := r.pool.Get(context.Background(), "o")
	assert.ErrorIs(t, err, fabric.ErrPeerClosed)
	r.fail.Store(false)
	c, _, err := r.pool.Get(context.Background(), "o")
	require.NoError(t, err, "the failed dial gave its slot back")
	r.pool.Put(c)
}

func TestPoolClose(t *testing.T) {
	r := newRig(1, 0, 0)
	ctx := context.Background()
	a, _, err := r.pool.Get(ctx, "o")
	require.NoError(t, err)
	errc := make(chan error)
	go func() {
		_, _, err := r.pool.Get(ctx, "o")
		errc <- err
	}()
	require.Eventually(t, func() bool { return r.waits.Load() == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, r.pool.Close())
	assert.True(t, errors.Is(<-errc, fabric.ErrClosed), "the waiter is failed")
	assert.True(t, a.closed.Load(), "busy connections are closed too")
	r.pool.Put(a) // after Close: closed, not kept
	r.pool.Discard(a)
	_, _, err = r.pool.Get(ctx, "o")
	assert.ErrorIs(t, err, fabric.ErrClosed)
	require.NoError(t, r.pool.Close(), "idempotent")
}
