package tensor

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/tensor/nodepool"
)

// TestSlabFromNodePool: with a node pool as its Source, a slab is the
// pool's memfd (its pages resident before the allocation), sealed and
// exported like any slab; a request the pool cannot serve makes its own
// slab, counted; a memfd much larger than asked is shrunk to the request.
func TestSlabFromNodePool(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ctx, cancel := context.WithCancel(context.Background())
	sock := nodepool.SocketPath(t.TempDir())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = nodepool.Serve(ctx, nodepool.Config{Socket: sock, Budget: 32 << 20})
	}()
	t.Cleanup(func() { cancel(); <-served })
	c := nodepool.Open(sock, nil, nil)
	t.Cleanup(func() { c.Close() })
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	require.NoError(t, c.Connected(wctx))
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := c.ServerStats(ctx)
		if err == nil && st.Ready == 32<<20 {
			break
		}
		require.True(t, time.Now().Before(deadline), "pool never filled: %+v %v", st, err)
	}

	m, err := NewSlabMemory(SlabConfig{SlabSize: 4 << 20, Source: c})
	require.NoError(t, err)
	defer m.Close()
	b, err := m.Alloc(ctx, 6<<20)
	require.NoError(t, err)
	p, _ := BytesOf(b)
	copy(p, "from the pool")
	h, err := ExportOf(b, ReadOnly)
	require.NoError(t, err)
	defer unix.Close(h.FD)
	assert.True(t, h.Slab)
	assert.EqualValues(t, 6<<20, h.Size, "32 MiB is more than a slab beyond 6 MiB: shrunk to the request")
	seals, err := unix.FcntlInt(uintptr(h.FD), unix.F_GET_SEALS, 0)
	require.NoError(t, err)
	assert.NotZero(t, seals&unix.F_SEAL_SHRINK, "size sealed")
	got := make([]byte, 13)
	_, err = unix.Pread(h.FD, got, h.Offset)
	require.NoError(t, err)
	assert.Equal(t, "from the pool", string(got))
	src, own := m.SourceStats()
	assert.EqualValues(t, 1, src)
	assert.Zero(t, own)

	// Larger than the pool's budget: a slab of its own, counted.
	big, err := m.Alloc(ctx, 40<<20)
	require.NoError(t, err)
	src, own = m.SourceStats()
	assert.EqualValues(t, 1, src)
	assert.EqualValues(t, 1, own)
	assert.EqualValues(t, 1, c.Stats().Misses)
	require.NoError(t, big.Release())
	require.NoError(t, b.Release())
}
