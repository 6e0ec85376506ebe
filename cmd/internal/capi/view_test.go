package capi

import (
	"context"
	"errors"
	"runtime/debug"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestViewZeroCopy(t *testing.T) {
	for _, tc := range []struct {
		name      string
		shareable bool
		populate  bool
	}{
		{"foreign memory, staged once", false, false},
		{"shareable memory", true, false},
		{"populated", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, a, b := pair(t, `{"allow":["shm"]}`)
			ctx := context.Background()
			src := pattern(1 << 20)
			mem := src
			if tc.shareable {
				p, err := a.Alloc(ctx, int64(len(src)))
				require.NoError(t, err)
				mem = unsafe.Slice((*byte)(p), len(src))
				copy(mem, src)
			}
			ref, err := a.Put(ctx, Region{Mem: mem, DType: "uint8", Shape: []int64{int64(len(src))}})
			require.NoError(t, err)

			h, p, n, x, err := b.View(ctx, ref, ViewConfig{Populate: tc.populate}, 7, 0)
			require.NoError(t, err)
			assert.True(t, x.Stats.ZeroCopy)
			assert.Equal(t, "shm", x.Stats.Transport)
			require.Equal(t, int64(len(src)), n)
			got := unsafe.Slice((*byte)(p), n)
			assert.Equal(t, src, got)
			s := b.Stats()
			assert.Equal(t, int64(1), s.Views)
			assert.Equal(t, 1, s.LiveViews)
			assert.Equal(t, int64(0), s.HostMemory.Used, "a view allocates nothing on the reader")

			// The owner frees the object and the reader drops its lease:
			// the mapping stays valid, with the object's bytes.
			require.NoError(t, b.Release(ctx, ref))
			require.NoError(t, a.Free(ctx, ref, 0))
			if !tc.shareable {
				clear(src) // the caller may reuse its array once Free returns
			}
			assert.Equal(t, pattern(1<<20), got)

			require.NoError(t, b.ReleaseView(h))
			require.NoError(t, b.ReleaseView(h), "idempotent")
			assert.Equal(t, 0, b.Stats().LiveViews)
			assert.Equal(t, int64(0), a.Stats().HostMemory.Used-usedByAllocs(a), "owner memory back to its baseline")
		})
	}
}

// usedByAllocs is the owner's memory still held by Alloc (the test's own
// shareable array), which Free does not give back.
func usedByAllocs(r *Runtime) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, a := range r.allocs {
		n += a.n
	}
	return n
}

func TestViewIsReadOnly(t *testing.T) {
	_, a, b := pair(t, `{"allow":["shm"]}`)
	ctx := context.Background()
	ref, err := a.Put(ctx, Region{Mem: pattern(4096), DType: "uint8", Shape: []int64{4096}})
	require.NoError(t, err)
	h, p, _, _, err := b.View(ctx, ref, ViewConfig{}, 0, 0)
	require.NoError(t, err)
	defer b.ReleaseView(h)

	// A write through the view faults (SIGSEGV), which SetPanicOnFault
	// turns into a recoverable panic in this goroutine.
	faulted := func() (f bool) {
		old := debug.SetPanicOnFault(true)
		defer debug.SetPanicOnFault(old)
		defer func() { f = recover() != nil }()
		*(*byte)(p) = 1
		return false
	}()
	assert.True(t, faulted, "writing to a view must fault")
	assert.Equal(t, pattern(4096)[0], *(*byte)(p))
}

func TestViewErrors(t *testing.T) {
	_, a, b := pair(t, `{"allow":["tcp"]}`)
	ctx := context.Background()
	ref, err := a.Put(ctx, Region{Mem: pattern(4096), DType: "uint8", Shape: []int64{4096}})
	require.NoError(t, err)
	_, _, _, _, err = b.View(ctx, ref, ViewConfig{}, 0, 0)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNoZeroCopy), "%v", err)
	assert.Equal(t, int64(0), b.Stats().GetErrors, "no zero-copy path is not a failed read")

	_, _, _, _, err = b.View(ctx, []byte("not a ref"), ViewConfig{}, 0, 0)
	assert.Equal(t, "malformed_ref", Kinds[Code(err)], "%v", err)

	require.NoError(t, a.Free(ctx, ref, 0))
}
