package shm

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// sinkFixture is a fixture whose object is also a push destination: the
// sink's claim resolves to whatever buffer at holds (nil: freed).
type sinkFixture struct {
	*fixture
	at    atomic.Pointer[tensor.Buffer]
	sinks atomic.Int64 // OpenSink calls
	stale atomic.Bool  // the owner reset: every claim is stale
}

func newSinkFixture(t *testing.T, size int64, mutate ...func(*ServerConfig, *Config)) *sinkFixture {
	sf := &sinkFixture{}
	sf.fixture = newFixture(t, size, func(s *ServerConfig, c *Config) {
		for _, m := range mutate {
			m(s, c)
		}
		inner := s.Source
		s.Source = fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			if sf.stale.Load() {
				return nil, fabric.ErrStaleRef
			}
			return inner.Open(ctx, c)
		})
		s.Sink = sinkFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			sf.sinks.Add(1)
			b := sf.at.Load()
			switch {
			case sf.stale.Load():
				return nil, fabric.ErrStaleRef
			case c.Object != sf.claim.Object:
				return nil, fabric.ErrObjectNotFound
			case b == nil:
				return nil, fabric.ErrObjectFreed
			case !bytes.Equal(c.Token, sf.claim.Token):
				return nil, fabric.ErrUnauthorized
			}
			return nopRelease{*b}, nil
		})
	})
	sf.at.Store(&sf.obj)
	return sf
}

// TestPushReusesMapping: the weight-sync pattern, one sink pushed into over
// and over. The sink's pages are mapped (writable) once and every later
// push reuses the mapping, still re-validated by the owner each time; the
// mapping covers the sink's own pages and nothing else of the arena.
func TestPushReusesMapping(t *testing.T) {
	const n = 3<<20 + 13
	f := newSinkFixture(t, n)
	tr := f.cli.SHM()
	src, p := hostDst(t, n)
	for i := range 5 {
		fillPattern(p, byte(i+10))
		r := f.remote(n)
		if i == 4 {
			// A sub-range reuses the same mapping too.
			r.Offset, r.Length = 4097, 1<<20
		}
		st, err := tr.Write(context.Background(), src, r)
		require.NoError(t, err, "push %d", i)
		assert.Equal(t, r.Length, st.Bytes)
		require.True(t, bytes.Equal(p[:r.Length], f.data[r.Offset:r.Offset+r.Length]), "push %d: the sink holds what was pushed", i)
	}
	assert.EqualValues(t, 5, f.sinks.Load(), "every push re-validated its claim with the owner")
	s := f.cli.CacheStats()
	assert.EqualValues(t, 1, s.Push.Mapped, "one descriptor for five pushes")
	assert.EqualValues(t, 4, s.Push.Hits)
	assert.Zero(t, s.Pull.Mapped)
	assert.Equal(t, 1, s.Live)
	h, err := tensor.ExportOf(f.obj, tensor.Writable)
	require.NoError(t, err)
	closeAll([]int{h.FD})
	pages := (h.Offset+h.Length+pageSize-1)&^(pageSize-1) - h.Offset&^(pageSize-1)
	assert.Equal(t, pages, s.Bytes, "only the sink's own pages are mapped")
	assert.EqualValues(t, 4, eventMetric(t, f.cli, "hit", "push"))
	assert.EqualValues(t, 1, eventMetric(t, f.cli, "mapped", "push"))

	// Reading the same object maps it apart, read-only: a read never gets
	// write access through the push mapping, nor the other way round.
	dst, got := hostDst(t, n)
	_, err = tr.Read(context.Background(), f.remote(n), dst)
	require.NoError(t, err)
	assert.Equal(t, f.data, got[:n])
	s = f.cli.CacheStats()
	assert.EqualValues(t, 1, s.Pull.Mapped)
	assert.Equal(t, 2, s.Live)
}

// TestPushRevocation: once the sink is freed, a push never writes through
// its cached mapping again: the owner refuses the claim, the push fails
// with the owner's typed error, the mapping is dropped and unmapped, and
// the memory (reused by the owner meanwhile) is left alone.
func TestPushRevocation(t *testing.T) {
	const n = 1<<20 + 5
	f := newSinkFixture(t, n)
	tr := f.cli.SHM()
	src, p := hostDst(t, n)
	fillPattern(p, 0x21)
	for range 2 {
		_, err := tr.Write(context.Background(), src, f.remote(n))
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, f.cli.CacheStats().Push.Hits)

	f.at.Store(nil)
	// The arena reuses the freed sink's pages for something else.
	fillPattern(f.data, 0x77)
	want := append([]byte(nil), f.data...)
	fillPattern(p, 0x99)
	_, err := tr.Write(context.Background(), src, f.remote(n))
	require.ErrorIs(t, err, fabric.ErrObjectFreed)
	assert.Equal(t, want, f.data, "a refused push wrote into freed memory")
	s := f.cli.CacheStats()
	assert.EqualValues(t, 1, s.Push.Revoked)
	assert.Zero(t, s.Live)
	assert.EqualValues(t, 1, s.Unmapped)
	assert.EqualValues(t, 1, eventMetric(t, f.cli, "revoked", "push"))

	// Every later push is refused too, and maps nothing.
	_, err = tr.Write(context.Background(), src, f.remote(n))
	require.ErrorIs(t, err, fabric.ErrObjectFreed)
	assert.Equal(t, want, f.data)
	assert.EqualValues(t, 1, f.cli.CacheStats().Push.Mapped)
}

// TestPushSinkMoved: a claim that now resolves to another place (another
// arena region) gets a fresh descriptor, and the push lands there, never
// in the old place the cached mapping covers.
func TestPushSinkMoved(t *testing.T) {
	const n = 64 << 10
	f := newSinkFixture(t, n)
	tr := f.cli.SHM()
	src, p := hostDst(t, n)
	fillPattern(p, 1)
	_, err := tr.Write(context.Background(), src, f.remote(n))
	require.NoError(t, err)
	moved, err := f.mem.Alloc(context.Background(), n)
	require.NoError(t, err)
	defer moved.Release()
	f.at.Store(&moved)
	old := append([]byte(nil), f.data...)
	fillPattern(p, 2)
	_, err = tr.Write(context.Background(), src, f.remote(n))
	require.NoError(t, err)
	got, _ := tensor.BytesOf(moved)
	assert.True(t, bytes.Equal(p[:n], got[:n]), "the push landed in the sink's new place")
	assert.Equal(t, old, f.data, "the old place was not written")
	s := f.cli.CacheStats()
	assert.EqualValues(t, 2, s.Push.Mapped)
	assert.Zero(t, s.Push.Hits)
	assert.Equal(t, 1, s.Live, "the new mapping replaced the old one")
	assert.EqualValues(t, 1, s.Unmapped)
}

// TestPushClientClose: closing the client unmaps its push mappings, and a
// later push fails with fabric.ErrClosed.
func TestPushClientClose(t *testing.T) {
	const n = 8192
	f := newSinkFixture(t, n)
	src, _ := hostDst(t, n)
	_, err := f.cli.SHM().Write(context.Background(), src, f.remote(n))
	require.NoError(t, err)
	require.Equal(t, 1, f.cli.CacheStats().Live)
	require.NoError(t, f.cli.Close())
	s := f.cli.CacheStats()
	assert.Zero(t, s.Live)
	assert.EqualValues(t, 1, s.Unmapped)
	_, err = f.cli.SHM().Write(context.Background(), src, f.remote(n))
	require.ErrorIs(t, err, fabric.ErrClosed)
}

// TestPushOwnerClosed: an owner that goes away takes its push mappings
// with it, and the push fails with a typed error.
func TestPushOwnerClosed(t *testing.T) {
	const n = 8192
	f := newSinkFixture(t, n)
	src, _ := hostDst(t, n)
	_, err := f.cli.SHM().Write(context.Background(), src, f.remote(n))
	require.NoError(t, err)
	require.NoError(t, f.srv.Close())
	_, err = f.cli.SHM().Write(context.Background(), src, f.remote(n))
	require.ErrorIs(t, err, fabric.ErrPeerClosed)
	s := f.cli.CacheStats()
	assert.Zero(t, s.Live)
	assert.EqualValues(t, 1, s.Push.Purged)
}

// TestStaleIncarnation: an owner that calls a claim stale (it reset its
// objects) takes every mapping of that incarnation with it, read and push
// alike, and transfers fail with fabric.ErrStaleRef.
func TestStaleIncarnation(t *testing.T) {
	const n = 64 << 10
	f := newSinkFixture(t, n)
	tr := f.cli.SHM()
	src, _ := hostDst(t, n)
	_, err := tr.Write(context.Background(), src, f.remote(n))
	require.NoError(t, err)
	dst, _ := hostDst(t, n)
	_, err = tr.Read(context.Background(), f.remote(n), dst)
	require.NoError(t, err)
	require.Equal(t, 2, f.cli.CacheStats().Live)

	f.stale.Store(true)
	_, err = tr.Read(context.Background(), f.remote(n), dst)
	require.ErrorIs(t, err, fabric.ErrStaleRef)
	s := f.cli.CacheStats()
	assert.Zero(t, s.Live, "the push mapping of the stale incarnation went too")
	assert.EqualValues(t, 1, s.Pull.Revoked)
	assert.EqualValues(t, 1, s.Push.Revoked)
	assert.EqualValues(t, 2, s.Unmapped)
	_, err = tr.Write(context.Background(), src, f.remote(n))
	require.ErrorIs(t, err, fabric.ErrStaleRef)
}

// TestPushHoldTimeout: a pusher held up between the grant and its copy
// past the owner's HoldTimeout writes nothing: the owner dropped the
// connection and unpinned the sink, and the push checks the connection
// before every chunk it writes.
func TestPushHoldTimeout(t *testing.T) {
	const n = 1 << 20
	f := newSinkFixture(t, n, func(s *ServerConfig, c *Config) {
		s.HoldTimeout = 50 * time.Millisecond
		c.ChunkSize = 64 << 10
	})
	src, p := hostDst(t, n)
	fillPattern(p, 0x3c)
	before := append([]byte(nil), f.data...)
	hold, mapped := make(chan struct{}), make(chan struct{})
	f.cli.afterMap = func() { close(mapped); <-hold }
	done := make(chan error, 1)
	go func() {
		_, err := f.cli.SHM().Write(context.Background(), src, f.remote(n))
		done <- err
	}()
	<-mapped
	deadline := time.Now().Add(30 * time.Second)
	for f.srv.connCount() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	require.Zero(t, f.srv.connCount(), "the owner kept a connection past HoldTimeout")
	close(hold)
	select {
	case err := <-done:
		require.ErrorIs(t, err, fabric.ErrPeerClosed)
	case <-time.After(30 * time.Second):
		t.Fatal("HUNG")
	}
	f.cli.afterMap = nil
	assert.Equal(t, before, f.data, "a push wrote into a sink its owner had unpinned")
}

// TestPushSharesCacheLimits: push mappings count against the same limits
// as read mappings, and are evicted (least recently used first) like them.
func TestPushSharesCacheLimits(t *testing.T) {
	const n = 64 << 10
	f := newSinkFixture(t, n, func(s *ServerConfig, c *Config) { c.MaxMappings = 1 })
	src, _ := hostDst(t, n)
	_, err := f.cli.SHM().Write(context.Background(), src, f.remote(n))
	require.NoError(t, err)
	dst, got := hostDst(t, n)
	_, err = f.cli.SHM().Read(context.Background(), f.remote(n), dst)
	require.NoError(t, err)
	assert.Equal(t, f.data, got[:n])
	s := f.cli.CacheStats()
	assert.Equal(t, 1, s.Live)
	assert.EqualValues(t, 1, s.Push.Evicted, "the read's mapping pushed the push mapping out")
	assert.EqualValues(t, 1, s.Unmapped)
	// The next push maps again: a miss, not a hit on a dropped mapping.
	_, err = f.cli.SHM().Write(context.Background(), src, f.remote(n))
	require.NoError(t, err)
	s = f.cli.CacheStats()
	assert.EqualValues(t, 2, s.Push.Mapped)
	assert.Zero(t, s.Push.Hits)
	assert.EqualValues(t, 1, s.Pull.Evicted)
}
