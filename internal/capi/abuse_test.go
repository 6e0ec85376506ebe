package capi

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// Issue 29's C ABI items, through the Go side of the ABI: each test fails on
// the code before its fix.

// forge returns ref with its shape replaced (strides made row-major): a
// reader that trusts it would allocate for that shape.
func forge(t *testing.T, ref []byte, shape ...int64) []byte {
	t.Helper()
	r, err := rdt.ParseRef(ref)
	require.NoError(t, err)
	r.Desc.Shape, r.Desc.Strides = shape, tensor.ContiguousStrides(shape)
	p, err := r.MarshalBinary()
	require.NoError(t, err)
	return p
}

// TestForgedShapeAllocatesNothing (item 1): a ref of an 8-byte object with
// its shape forged to 64 MiB is refused as layout_mismatch before the
// reader allocates: its host memory's peak and, in slab mode, its slab
// count do not move. Before, Get allocated (and populated) the forged size
// first, and in slab mode kept a slab of it.
func TestForgedShapeAllocatesNothing(t *testing.T) {
	for _, tc := range []struct{ name, config string }{
		{"per-object, shm", `{"allow":["shm"]}`},
		{"per-object, tcp", `{"allow":["tcp"]}`},
		{"slabs", `{"allow":["shm"],"slabs":true,"cluster_key":"` + slabKey + `","pool_bytes":4194304,"slab_bytes":4194304}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, a, b := pair(t, tc.config)
			ctx := context.Background()
			ref, err := a.Put(ctx, Region{Mem: pattern(8), DType: "float32", Shape: []int64{2}})
			require.NoError(t, err)
			forged := forge(t, ref, 16<<20) // 64 MiB of float32
			for name, r := range map[string]*Runtime{"reader": b, "owner": a} {
				before := r.Stats().HostMemory
				_, _, _, err = r.Get(ctx, forged, 0, 10*time.Second)
				assert.Equal(t, "layout_mismatch", Kinds[Code(err)], "%s: %v", name, err)
				after := r.Stats().HostMemory
				assert.Equal(t, before.Peak, after.Peak, "%s: the forged size was allocated", name)
				assert.Equal(t, before.SlabCount, after.SlabCount, "%s: a slab was made for the forged size", name)
				assert.Equal(t, before.Used, after.Used, name)
			}
			// The true ref still reads.
			p, n, _, err := b.Get(ctx, ref, 0, 10*time.Second)
			require.NoError(t, err)
			assert.EqualValues(t, 8, n)
			require.NoError(t, b.FreeMemory(p))
		})
	}
}
