package tcp

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// gatedOwner is a fixture whose Source holds every claim resolution until
// the gate opens, so a test can keep connections busy on purpose.
type gatedOwner struct {
	*fixture
	gate    chan struct{}
	waiting chan struct{} // one value per resolution that reached the gate
}

func newGatedOwner(t *testing.T, n int64) *gatedOwner {
	g := &gatedOwner{gate: make(chan struct{}), waiting: make(chan struct{}, 64)}
	g.fixture = newFixture(t, n, func(c *ServerConfig) {
		open := c.Source
		c.Source = fabric.SourceFunc(func(ctx context.Context, cl fabric.Claim) (tensor.Buffer, error) {
			g.waiting <- struct{}{}
			select {
			case <-g.gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return open.Open(ctx, cl)
		})
	})
	return g
}

// counting returns a Dial that counts the connections it makes.
func counting(n *atomic.Int64) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
}

// readAsync starts a read of n bytes and returns where its error arrives.
func (f *fixture) readAsync(t *testing.T, ctx context.Context, tr *Transport, n int64) <-chan error {
	dst := f.dst(t, n)
	done := make(chan error, 1)
	go func() {
		_, err := tr.Read(ctx, f.remote(n), dst)
		if err == nil {
			if got, _ := tensor.BytesOf(dst); !bytes.Equal(got, f.data[:n]) {
				err = assert.AnError
			}
		}
		done <- err
	}()
	return done
}

// TestPoolQueuesAtMaxConns: with MaxConns busy, a transfer waits for a
// connection instead of dialing more; its ctx bounds the wait; a
// connection given back goes to the waiter; a busy connection that breaks
// hands its slot on, so the waiter dials.
func TestPoolQueuesAtMaxConns(t *testing.T) {
	g := newGatedOwner(t, 64<<10)
	var dials atomic.Int64
	tr := g.transport(t, Config{Compression: CompressOff, MaxConns: 2, Dial: counting(&dials)})
	bg := context.Background()

	cancelled, cancel := context.WithCancel(bg)
	first := g.readAsync(t, cancelled, tr, 64<<10)
	second := g.readAsync(t, bg, tr, 4096)
	<-g.waiting
	<-g.waiting // both connections are busy at the owner

	short, stop := context.WithTimeout(bg, 50*time.Millisecond)
	defer stop()
	_, err := tr.Read(short, g.remote(10), g.dst(t, 10))
	assert.ErrorIs(t, err, context.DeadlineExceeded, "waited for a connection, no more than ctx allowed")
	assert.Equal(t, int64(2), dials.Load(), "no third connection")

	third := g.readAsync(t, bg, tr, 1000)
	require.Eventually(t, func() bool { return testutil.ToFloat64(tr.m.waits) == 2 }, 5*time.Second, time.Millisecond)
	// The first transfer gives up: its connection closes and the queued
	// transfer gets its slot and dials.
	cancel()
	assert.ErrorIs(t, <-first, context.Canceled)
	<-g.waiting
	close(g.gate)
	require.NoError(t, <-second)
	require.NoError(t, <-third)
	assert.Equal(t, int64(3), dials.Load())

	// Many at once over two connections.
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() { assert.NoError(t, <-g.readAsync(t, bg, tr, 4096)) })
	}
	wg.Wait()
	assert.Equal(t, int64(3), dials.Load(), "queued transfers reuse the pool")
}

// TestPoolCloseWakesWaiters: Close fails a transfer waiting for a
// connection at once.
func TestPoolCloseWakesWaiters(t *testing.T) {
	g := newGatedOwner(t, 4096)
	defer close(g.gate)
	tr := g.transport(t, Config{Compression: CompressOff, MaxConns: 1})
	busy := g.readAsync(t, context.Background(), tr, 10)
	<-g.waiting
	queued := g.readAsync(t, context.Background(), tr, 10)
	require.Eventually(t, func() bool { return testutil.ToFloat64(tr.m.waits) == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, tr.Close())
	assert.ErrorIs(t, <-queued, fabric.ErrClosed)
	assert.Error(t, <-busy)
}

// TestPoolKeepsConcurrentConnections: a steady load of concurrent
// transfers reuses its connections (the default MaxIdle keeps as many as
// MaxConns allows), and idle ones past IdleTimeout are closed.
func TestPoolKeepsConcurrentConnections(t *testing.T) {
	f := newFixture(t, 4096, nil)
	var dials atomic.Int64
	tr := f.transport(t, Config{Compression: CompressOff, Dial: counting(&dials), IdleTimeout: time.Hour})
	for range 5 {
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() { assert.NoError(t, <-f.readAsync(t, context.Background(), tr, 4096)) })
		}
		wg.Wait()
	}
	assert.LessOrEqual(t, dials.Load(), int64(32))
	assert.Equal(t, float64(dials.Load()), testutil.ToFloat64(tr.m.dials))

	// The same load, then a pause longer than IdleTimeout: the next
	// transfer gives back its connection and the stale ones are closed.
	tr2 := f.transport(t, Config{Compression: CompressOff, IdleTimeout: 20 * time.Millisecond})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { assert.NoError(t, <-f.readAsync(t, context.Background(), tr2, 4096)) })
	}
	wg.Wait()
	time.Sleep(40 * time.Millisecond) // let them go stale
	require.NoError(t, <-f.readAsync(t, context.Background(), tr2, 4096))
	open, idle, all := tr2.pool.Stats(connKey{f.ownerID.String(), f.srv.Addr()})
	assert.Equal(t, 1, idle)
	assert.Equal(t, 1, open)
	assert.Equal(t, 1, all)
}

// A pooled connection the server reaped as idle (ServerConfig.Limits) is
// replaced on the next transfer, which succeeds: the idle timeout costs
// readers a handshake, never a failed transfer.
func TestPooledConnReapedAsIdle(t *testing.T) {
	f := newFixture(t, 64<<10, func(c *ServerConfig) { c.Limits.IdleTimeout = 100 * time.Millisecond })
	var dials atomic.Int64
	tr := f.transport(t, Config{Compression: CompressOff, Dial: counting(&dials)})
	ctx := context.Background()
	require.NoError(t, <-f.readAsync(t, ctx, tr, 64<<10))
	require.Eventually(t, func() bool { return f.srv.loop.Len() == 0 }, 20*time.Second, 5*time.Millisecond,
		"the server reaps the idle pooled connection")
	require.NoError(t, <-f.readAsync(t, ctx, tr, 64<<10))
	assert.Equal(t, int64(2), dials.Load(), "one fresh connection replaced the reaped one")
}
