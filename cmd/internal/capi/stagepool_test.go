package capi

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
)

// The pool keeps at most its limit ready, of the sizes used lately, and
// gives everything back on close.
func TestStagePoolBounded(t *testing.T) {
	host := tensor.NewHostMemory(0)
	defer host.Close()
	const MiB = 1 << 20
	p := newStagePool(host, 3*MiB)
	ctx := context.Background()
	take := func(n int64) {
		t.Helper()
		b, err := p.Alloc(ctx, n)
		require.NoError(t, err)
		assert.Equal(t, n, b.Len())
		require.NoError(t, b.Release())
		p.fills.Wait()
	}
	take(4096) // too small to pool
	assert.Equal(t, int64(0), p.held.Load())
	take(2 * MiB) // a miss; refills one of 2 MiB
	assert.Equal(t, int64(2*MiB), p.held.Load())
	take(2 * MiB) // a hit; refills again
	assert.Equal(t, int64(1), p.hits.Load())
	assert.Equal(t, int64(2*MiB), p.held.Load())
	take(3 * MiB) // evicts the 2 MiB one to make room
	assert.Equal(t, int64(3*MiB), p.held.Load())
	take(4 * MiB) // larger than the pool: never pooled
	assert.Equal(t, int64(3*MiB), p.held.Load())
	assert.LessOrEqual(t, host.Stats().Used, int64(3*MiB))
	p.close()
	assert.Equal(t, int64(0), p.held.Load())
	assert.Equal(t, int64(0), host.Stats().Used)
	take(2 * MiB) // after close: plain allocations, no refill
	assert.Equal(t, int64(0), p.held.Load())

	off := newStagePool(host, 0) // stage_pool_bytes < 0
	take2, err := off.Alloc(ctx, 2*MiB)
	require.NoError(t, err)
	take2.Release()
	off.fills.Wait()
	assert.Equal(t, int64(0), off.held.Load())
}
