package capi

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt/schema"
)

const slabKey = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

// TestSlabMode: two runtimes of one host in slab mode (one trust scope: the
// cluster key) pass shareable and foreign arrays; the reader maps the
// owner's slab once for all of them and for a view, and freed memory is
// reused without new slabs, but not under a live view.
func TestSlabMode(t *testing.T) {
	_, a, b := pair(t, `{"allow":["shm"],"slabs":true,"cluster_key":"`+slabKey+`","pool_bytes":16777216,"slab_bytes":8388608}`)
	ctx := context.Background()
	const n = 1 << 20
	want := pattern(n)

	var refs [][]byte
	for i := 0; i < 3; i++ {
		p, err := a.Alloc(ctx, n)
		require.NoError(t, err)
		copy(unsafe.Slice((*byte)(p), n), want)
		ref, err := a.Put(ctx, Region{Mem: unsafe.Slice((*byte)(p), n), DType: "uint8", Shape: []int64{n}})
		require.NoError(t, err)
		refs = append(refs, ref)
		t.Cleanup(func() { a.FreeMemory(p) })
	}
	foreign := append([]byte(nil), want...)
	ref, err := a.Put(ctx, Region{Mem: foreign, DType: "uint8", Shape: []int64{n}})
	require.NoError(t, err)
	refs = append(refs, ref)

	for _, ref := range refs {
		p, m, x, err := b.Get(ctx, ref, 0, 10*time.Second)
		require.NoError(t, err)
		assert.Equal(t, "shm", x.Stats.Transport)
		assert.Equal(t, want, unsafe.Slice((*byte)(p), m))
		require.NoError(t, b.FreeMemory(p))
	}
	// A view maps nothing new and stays the object's bytes after the owner
	// frees it and allocates again: the owner holds its range until
	// ReleaseView.
	hv, vp, vn, x, err := b.View(ctx, refs[0], ViewConfig{Populate: true}, 0, 10*time.Second)
	require.NoError(t, err)
	assert.True(t, x.Stats.ZeroCopy)
	view := unsafe.Slice((*byte)(vp), vn)
	assert.Equal(t, want, view)

	sb := b.Stats()
	assert.EqualValues(t, 1, sb.ShmSlabs["mapped"], "one mmap of the owner's slab for four objects: %v", sb.ShmSlabs)
	assert.True(t, sb.HostMemory.Slabs)
	sa := a.Stats()
	slabs := sa.HostMemory.SlabCount
	assert.EqualValues(t, 1, slabs, "the 16 MiB pool holds everything")

	// Free and publish again: the ranges are reused, no slab is made, and
	// the view keeps its bytes.
	for _, ref := range refs {
		require.NoError(t, b.Release(ctx, ref))
		require.NoError(t, a.Free(ctx, ref, 10*time.Second))
	}
	for i := 0; i < 3; i++ {
		p, err := a.Alloc(ctx, n)
		require.NoError(t, err)
		clear(unsafe.Slice((*byte)(p), n))
		defer a.FreeMemory(p)
	}
	assert.Equal(t, slabs, a.Stats().HostMemory.SlabCount)
	assert.Equal(t, want, view, "the view changed after the owner freed its object")
	require.NoError(t, b.ReleaseView(hv))
}

// TestSlabConfig: slab mode needs a cluster key and host memory.
func TestSlabConfig(t *testing.T) {
	t.Setenv(EnvClusterKey, "")
	t.Setenv(EnvSlabs, "")
	t.Setenv(EnvPoolBytes, "")
	ctx := context.Background()
	lib := New()
	defer lib.CloseAll(ctx)
	for _, c := range []string{
		`{"slabs":true}`,
		`{"slabs":true,"sim_devices":true,"cluster_key":"` + slabKey + `"}`,
		`{"slabs":true,"pool_bytes":-1,"cluster_key":"` + slabKey + `"}`,
	} {
		_, err := lib.NewRuntime(ctx, []byte(c))
		assert.ErrorIs(t, err, ErrInvalidArgument, c)
	}
	t.Setenv(EnvSlabs, "1")
	_, err := lib.NewRuntime(ctx, nil)
	assert.ErrorIs(t, err, ErrInvalidArgument, "TENSORLANE_SLABS=1 without a key")
	t.Setenv(EnvSlabs, "maybe")
	_, err = lib.NewRuntime(ctx, nil)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	t.Setenv(EnvSlabs, "1")
	t.Setenv(EnvClusterKey, slabKey)
	t.Setenv(EnvPoolBytes, "4M")
	h, err := lib.NewRuntime(ctx, nil)
	require.NoError(t, err)
	r, err := lib.Runtime(h)
	require.NoError(t, err)
	assert.True(t, r.Stats().HostMemory.Slabs)
	assert.EqualValues(t, 1, r.Stats().HostMemory.SlabCount, "a 4 MiB pool is one slab")
	require.NoError(t, lib.Close(ctx, h))
	for in, want := range map[string]int64{"256M": 256 << 20, "1GiB": 1 << 30, "4096": 4096, "8k": 8 << 10} {
		got, err := schema.ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	_, err = schema.ParseSize("lots")
	assert.Error(t, err)
}

// TestPoolWithoutSlabs: with per-object grants, pool_bytes holds resident
// memory for the first large Get's destination (tensor.HostMemory.Prefault):
// counted as cached until that Get takes it, and the bytes arrive intact.
func TestPoolWithoutSlabs(t *testing.T) {
	_, a, b := pair(t, `{"allow":["shm"],"pool_bytes":8388608}`)
	ctx := context.Background()
	assert.EqualValues(t, 8<<20, b.Stats().HostMemory.Cached)
	const n = 4 << 20
	want := pattern(n)
	ref, err := a.Put(ctx, Region{Mem: append([]byte(nil), want...), DType: "uint8", Shape: []int64{n}})
	require.NoError(t, err)
	p, m, x, err := b.Get(ctx, ref, 0, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "shm", x.Stats.Transport)
	assert.Equal(t, want, unsafe.Slice((*byte)(p), m))
	assert.Zero(t, b.Stats().HostMemory.Cached, "the Get's destination took the pool")
	require.NoError(t, b.FreeMemory(p))
}
