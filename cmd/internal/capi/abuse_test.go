package capi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// Issue 29's C ABI items, through the Go side of the ABI: each test fails on
// the code before its fix.

// forge returns ref with its shape replaced (strides made row-major): a
// reader that trusts it would allocate for that shape.
func forge(t testing.TB, ref []byte, shape ...int64) []byte {
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
				// (A foreign Put's staging copy, 8 bytes, may land meanwhile.)
				assert.Less(t, after.Peak-before.Peak, int64(1<<20), "%s: the forged size was allocated", name)
				assert.Equal(t, before.SlabCount, after.SlabCount, "%s: a slab was made for the forged size", name)
			}
			// The true ref still reads.
			p, n, _, err := b.Get(ctx, ref, 0, 10*time.Second)
			require.NoError(t, err)
			assert.EqualValues(t, 8, n)
			require.NoError(t, b.FreeMemory(p))
		})
	}
}

// TestEmptyShapePut (item 16): a shape with a zero dimension is refused as
// invalid_argument; it used to index an empty region (a panic inside).
func TestEmptyShapePut(t *testing.T) {
	_, a, _ := pair(t, `{}`)
	for _, shape := range [][]int64{{0, 5}, {5, 0}, {0}} {
		var err error
		require.NotPanics(t, func() {
			_, err = a.Put(context.Background(), Region{Mem: pattern(64), DType: "float32", Shape: shape})
		}, "shape %v", shape)
		assert.Equal(t, "invalid_argument", Kinds[Code(err)], "shape %v: %v", shape, err)
	}
	_, err := a.Alloc(context.Background(), 1<<62)
	assert.Equal(t, "invalid_argument", Kinds[Code(err)], "%v", err)
}

// TestScalarRef (item 18): a 0-d tensor's ref says shape [] and strides []
// (it said null, which a binding cannot build an array from), and reads.
func TestScalarRef(t *testing.T) {
	_, a, b := pair(t, `{"allow":["shm"]}`)
	ctx := context.Background()
	ref, err := a.Put(ctx, Region{Mem: pattern(4), DType: "float32", Shape: []int64{}})
	require.NoError(t, err)
	info, err := DescribeRef(ref)
	require.NoError(t, err)
	p, err := json.Marshal(info)
	require.NoError(t, err)
	assert.Contains(t, string(p), `"shape":[],"strides":[]`)
	assert.EqualValues(t, 4, info.NBytes)
	got, n, _, err := b.Get(ctx, ref, 0, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, pattern(4), unsafe.Slice((*byte)(got), n))
	require.NoError(t, b.FreeMemory(got))
}

// TestViewHandlesAreProcessWide (item 17): two runtimes each hold a view;
// one's handle given to the other's ReleaseView releases nothing there.
// Handles used to count from 1 in each runtime, so it released the other's.
func TestViewHandlesAreProcessWide(t *testing.T) {
	_, a, b := pair(t, `{"allow":["shm"]}`)
	ctx := context.Background()
	refA, err := a.Put(ctx, Region{Mem: pattern(4096), DType: "uint8", Shape: []int64{4096}})
	require.NoError(t, err)
	refB, err := b.Put(ctx, Region{Mem: pattern(4096), DType: "uint8", Shape: []int64{4096}})
	require.NoError(t, err)
	hb, _, _, _, err := b.View(ctx, refA, ViewConfig{}, 0, 10*time.Second)
	require.NoError(t, err)
	ha, _, _, _, err := a.View(ctx, refB, ViewConfig{}, 0, 10*time.Second)
	require.NoError(t, err)
	assert.NotEqual(t, ha, hb)
	require.NoError(t, a.ReleaseView(hb))
	assert.Equal(t, 1, a.Views(), "a's view went with b's handle")
	assert.Equal(t, 1, b.Views())
	require.NoError(t, a.ReleaseView(ha))
	require.NoError(t, b.ReleaseView(hb))
	assert.Zero(t, a.Views()+b.Views())
}

// TestOwnViewRefused (item 20): a view of the runtime's own object is
// refused as no_zero_copy (the caller has the bytes; Get copies), so Free
// does not wait for it. It used to pin the object: Free waited its whole
// timeout and failed, and Close took its whole grace.
func TestOwnViewRefused(t *testing.T) {
	_, a, _ := pair(t, `{}`)
	ctx := context.Background()
	ref, err := a.Put(ctx, Region{Mem: pattern(4096), DType: "uint8", Shape: []int64{4096}})
	require.NoError(t, err)
	h, _, _, _, err := a.View(ctx, ref, ViewConfig{}, 0, 10*time.Second)
	assert.Equal(t, "no_zero_copy", Kinds[Code(err)], "%v", err)
	assert.Zero(t, h)
	p, n, _, err := a.Get(ctx, ref, 0, 10*time.Second)
	require.NoError(t, err, "Get copies the runtime's own object")
	assert.Equal(t, pattern(4096), unsafe.Slice((*byte)(p), n))
	require.NoError(t, a.FreeMemory(p))
	require.NoError(t, a.Free(ctx, ref, 2*time.Second))
}

// touchAll reads and writes every byte of p and reports a fault (memory
// unmapped under it) as an error instead of crashing the test binary.
func touchAll(p []byte, write bool) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fault: %v", r)
		}
	}()
	var sum byte
	for i := range p {
		sum += p[i]
		if write {
			p[i] = byte(i)
		}
	}
	_ = sum
	return nil
}

// TestCloseKeepsCallerMemory (item 4): closing a runtime unmaps nothing its
// caller still holds: memory from Alloc and Get stays usable until
// FreeMemory with the closed handle. Close used to unmap it: touching it
// crashed the process (a numpy array over it, at interpreter exit).
func TestCloseKeepsCallerMemory(t *testing.T) {
	for _, config := range []string{`{"allow":["shm"]}`, `{"allow":["shm"],"slabs":true,"cluster_key":"` + slabKey + `"}`} {
		t.Run(config, func(t *testing.T) {
			t.Setenv(EnvClusterKey, "")
			t.Setenv(EnvSlabs, "")
			lib := New()
			ctx := context.Background()
			ha, err := lib.NewRuntime(ctx, []byte(config))
			require.NoError(t, err)
			hb, err := lib.NewRuntime(ctx, []byte(config))
			require.NoError(t, err)
			a, _ := lib.Runtime(ha)
			b, _ := lib.Runtime(hb)
			const n = 1 << 20
			pa, err := a.Alloc(ctx, n)
			require.NoError(t, err)
			mem := unsafe.Slice((*byte)(pa), n)
			copy(mem, pattern(n))
			ref, err := a.Put(ctx, Region{Mem: mem, DType: "uint8", Shape: []int64{n}})
			require.NoError(t, err)
			pb, m, _, err := b.Get(ctx, ref, 0, 10*time.Second)
			require.NoError(t, err)
			got := unsafe.Slice((*byte)(pb), m)

			require.NoError(t, lib.CloseAll(ctx))
			require.NoError(t, touchAll(mem, true), "the owner's array after Close")
			require.NoError(t, touchAll(got, false), "the reader's array after Close")
			assert.Equal(t, pattern(n), got)
			allocs, _ := lib.Orphans()
			assert.Equal(t, 2, allocs)
			assert.Equal(t, "invalid_argument", Kinds[Code(lib.FreeMemory(ha, pb))], "b's memory is not a's to free")
			require.NoError(t, lib.FreeMemory(ha, pa))
			require.NoError(t, lib.FreeMemory(hb, pb))
			assert.Equal(t, "invalid_argument", Kinds[Code(lib.FreeMemory(hb, pb))], "freed twice")
			allocs, _ = lib.Orphans()
			assert.Zero(t, allocs)
		})
	}
}

// TestViewSurvivesReaderClose (item 10): in slab mode a live view keeps its
// object's bytes after the reader closes its runtime, while the owner frees
// the object and reuses its range; ReleaseView with the closed handle then
// unmaps it. Before, the owner reused the range under the view, and the
// reader's array silently showed another object.
func TestViewSurvivesReaderClose(t *testing.T) {
	t.Setenv(EnvClusterKey, "")
	t.Setenv(EnvSlabs, "")
	config := `{"allow":["shm"],"slabs":true,"cluster_key":"` + slabKey + `","pool_bytes":8388608,"slab_bytes":8388608}`
	lib := New()
	ctx := context.Background()
	defer lib.CloseAll(ctx)
	ha, err := lib.NewRuntime(ctx, []byte(config))
	require.NoError(t, err)
	hb, err := lib.NewRuntime(ctx, []byte(config))
	require.NoError(t, err)
	a, _ := lib.Runtime(ha)
	b, _ := lib.Runtime(hb)
	const n = 1 << 20
	want := pattern(n)
	p, err := a.Alloc(ctx, n)
	require.NoError(t, err)
	copy(unsafe.Slice((*byte)(p), n), want)
	ref, err := a.Put(ctx, Region{Mem: unsafe.Slice((*byte)(p), n), DType: "uint8", Shape: []int64{n}})
	require.NoError(t, err)
	require.NoError(t, a.FreeMemory(p)) // the object holds its range
	hv, vp, vn, _, err := b.View(ctx, ref, ViewConfig{}, 0, 10*time.Second)
	require.NoError(t, err)
	view := unsafe.Slice((*byte)(vp), vn)
	require.Equal(t, want, view)

	require.NoError(t, lib.Close(ctx, hb))
	require.NoError(t, a.Free(ctx, ref, 10*time.Second))
	for i := 0; i < 4; i++ { // the freed range, reused
		q, err := a.Alloc(ctx, n)
		require.NoError(t, err)
		clear(unsafe.Slice((*byte)(q), n))
		defer a.FreeMemory(q)
	}
	require.NoError(t, touchAll(view, false))
	assert.True(t, bytes.Equal(want, view), "the view's bytes changed after its runtime closed")
	_, views := lib.Orphans()
	assert.Equal(t, 1, views)
	require.NoError(t, lib.ReleaseView(hb, hv))
	require.NoError(t, lib.ReleaseView(hb, hv), "idempotent after close")
	_, views = lib.Orphans()
	assert.Zero(t, views)
}

// TestHoldKeepsObject (item 19): a reader's Hold keeps the object after
// its owner's Release, until the reader's Release. (A Get's own lease
// lasts for the Get only, which is what the header now says.)
func TestHoldKeepsObject(t *testing.T) {
	_, a, b := pair(t, `{"allow":["shm"]}`)
	ctx := context.Background()
	ref, err := a.Put(ctx, Region{Mem: pattern(4096), DType: "uint8", Shape: []int64{4096}})
	require.NoError(t, err)
	assert.Equal(t, "layout_mismatch", Kinds[Code(b.Hold(ctx, forge(t, ref, 1<<20), 10*time.Second))])
	require.NoError(t, b.Hold(ctx, ref, 10*time.Second))
	require.NoError(t, a.Release(ctx, ref)) // the owner is done: freed when no reader holds it
	assert.Equal(t, 1, a.Stats().Objects)
	dst := make([]byte, 4096)
	_, err = b.GetInto(ctx, ref, dst, 0, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, pattern(4096), dst)
	require.NoError(t, b.Release(ctx, ref))
	require.NoError(t, a.Free(ctx, ref, 10*time.Second))
	assert.Zero(t, a.Stats().Objects)
}
