package bcast

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Objects are numbered one after the other; each chunk number maps back
// to its object and range, and each range to its number.
func TestChunks(t *testing.T) {
	c, err := NewChunks(MinChunk)
	require.NoError(t, err)
	sizes := []int64{2*MinChunk + 5, 0, MinChunk, 1}
	for _, n := range sizes {
		require.NoError(t, c.Add(n))
	}
	require.Equal(t, 3+1+1+1, c.Len())
	assert.Equal(t, []int{3, 1, 1, 1}, []int{c.Count(0), c.Count(1), c.Count(2), c.Count(3)})
	type loc struct {
		k      int
		off, n int64
	}
	want := []loc{{0, 0, MinChunk}, {0, MinChunk, MinChunk}, {0, 2 * MinChunk, 5}, {1, 0, 0}, {2, 0, MinChunk}, {3, 0, 1}}
	for g, w := range want {
		k, off, n := c.Locate(g)
		assert.Equal(t, w, loc{k, off, n}, "chunk %d", g)
		i, err := c.Index(k, off, n)
		require.NoError(t, err)
		assert.Equal(t, g, i)
	}
	for _, bad := range []loc{{0, 1, MinChunk}, {0, 0, 5}, {0, 2 * MinChunk, MinChunk}, {0, 3 * MinChunk, 0}, {1, 0, 1}, {0, -MinChunk, MinChunk}} {
		_, err := c.Index(bad.k, bad.off, bad.n)
		assert.ErrorIs(t, err, ErrMalformed, "%+v", bad)
	}
}

// What a prepare notice may not ask a reader to keep.
func TestChunksBounds(t *testing.T) {
	_, err := NewChunks(0)
	assert.ErrorIs(t, err, ErrMalformed)
	small, err := NewChunks(MinChunk - 1)
	require.NoError(t, err)
	require.NoError(t, small.Add(MinChunk-1), "one small chunk holds a small object")
	assert.ErrorIs(t, small.Add(MinChunk), ErrMalformed, "small chunks may not cut an object")
	c, err := NewChunks(MinChunk)
	require.NoError(t, err)
	require.NoError(t, c.Add(MaxChunks*MinChunk))
	assert.Equal(t, MaxChunks, c.Len())
	assert.ErrorIs(t, c.Add(0), ErrMalformed, "past MaxChunks in all")
	assert.ErrorIs(t, c.Add(-1), ErrMalformed)
}
