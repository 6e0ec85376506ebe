package shm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestView: a view maps the owner's object read-only and copies nothing;
// it shares the read cache's mapping; Release unmaps it once the cache let
// go; a refused claim yields no view.
func TestView(t *testing.T) {
	const n = 5<<20 + 3
	f := newFixture(t, n, nil)
	tr := f.cli.SHM()
	buf, err := tr.View(context.Background(), f.remote(n))
	require.NoError(t, err)
	assert.Equal(t, int64(n), buf.Len())
	p, err := tensor.BytesOf(buf)
	require.NoError(t, err)
	assert.Equal(t, f.data, p, "the view shows the object")
	f.data[17] ^= 0xff
	assert.Equal(t, f.data[17], p[17], "in place: the owner's later writes show through")

	// A read after the view reuses its mapping.
	dst, got := hostDst(t, n)
	_, err = tr.Read(context.Background(), f.remote(n), dst)
	require.NoError(t, err)
	assert.Equal(t, f.data, got[:n])
	s := f.cli.CacheStats()
	assert.EqualValues(t, 1, s.Mapped)

	// A view of part of the object.
	part := f.remote(4096)
	part.Offset = 4096
	b2, err := tr.View(context.Background(), part)
	require.NoError(t, err)
	p2, _ := tensor.BytesOf(b2)
	assert.Equal(t, f.data[4096:8192], p2)
	require.NoError(t, b2.Release())

	// Revoked while viewed: the cache drops the mapping, the view keeps
	// its pages until it is released.
	f.freed.Store(true)
	_, err = tr.View(context.Background(), f.remote(n))
	require.ErrorIs(t, err, fabric.ErrObjectFreed)
	assert.Equal(t, f.data[:64], p[:64], "a live view stays readable after the revocation")
	require.NoError(t, buf.Release())
	require.NoError(t, buf.Release(), "idempotent")
	assert.Nil(t, buf.(interface{ Bytes() []byte }).Bytes(), "no bytes after Release")
	assert.EqualValues(t, 1, f.cli.CacheStats().Unmapped)

	_, err = tr.View(context.Background(), f.remote(0))
	assert.ErrorIs(t, err, fabric.ErrBadRequest)
}
