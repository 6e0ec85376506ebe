package capi

import (
	"context"
	"errors"
	"testing"
	"time"
	"unsafe"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt"
)

// TestBatchStateDict: an owner publishes a state dict in one PutBatch; a
// reader in slab mode reads it with one GetBatch (one coalesced shm batch)
// and maps it with one ViewBatch (the owner's slab mapped once), bytes
// checked; a freed ref and a malformed one fail alone.
func TestBatchStateDict(t *testing.T) {
	_, a, b := pair(t, `{"allow":["shm"],"slabs":true,"cluster_key":"`+slabKey+`","slab_bytes":8388608}`)
	ctx := context.Background()
	const items, n = 12, 64 << 10
	var regions []Region
	var want [][]byte
	for i := 0; i < items; i++ {
		p, err := a.Alloc(ctx, n)
		require.NoError(t, err)
		mem := unsafe.Slice((*byte)(p), n)
		for k := range mem {
			mem[k] = byte(i*31 + k)
		}
		want = append(want, append([]byte(nil), mem...))
		regions = append(regions, Region{Mem: mem, DType: "float32", Shape: []int64{n / 4}})
	}
	refs, err := a.PutBatch(ctx, regions)
	require.NoError(t, err)
	require.Len(t, refs, items)

	got, err := b.GetBatch(ctx, refs, 3, 10*time.Second)
	require.NoError(t, err)
	for i, g := range got {
		require.NoError(t, g.Err, "item %d", i)
		assert.Equal(t, want[i], unsafe.Slice((*byte)(g.Ptr), g.N), "item %d", i)
		require.NoError(t, b.FreeMemory(g.Ptr), "received memory is the caller's allocation")
	}
	s := b.Stats()
	assert.EqualValues(t, items, s.ByTransport["shm"])

	views, err := b.ViewBatch(ctx, refs, ViewConfig{Populate: true}, 0, 10*time.Second)
	require.NoError(t, err)
	for i, v := range views {
		require.NoError(t, v.Err, "item %d", i)
		assert.Equal(t, want[i], unsafe.Slice((*byte)(v.Ptr), v.N), "item %d", i)
	}
	s = b.Stats()
	assert.EqualValues(t, 1, s.ShmSlabs["mapped"], "one mapping of the owner's slab for every object: %v", s.ShmSlabs)
	assert.Equal(t, items, s.LiveViews)
	for _, v := range views {
		require.NoError(t, b.ReleaseView(v.View))
	}

	// One freed and one malformed ref among good ones fail alone.
	for _, ref := range refs {
		require.NoError(t, b.Release(ctx, ref))
	}
	require.NoError(t, a.Free(ctx, refs[1], 5*time.Second))
	mixed := [][]byte{refs[0], refs[1], []byte("not a ref"), refs[2]}
	got, err = b.GetBatch(ctx, mixed, 0, 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, got[0].Err)
	require.NoError(t, got[3].Err)
	assert.Error(t, got[1].Err)
	assert.True(t, errors.Is(got[2].Err, rdt.ErrMalformedRef), "%v", got[2].Err)
	for _, g := range []BatchGot{got[0], got[3]} {
		require.NoError(t, b.FreeMemory(g.Ptr))
	}
}

// TestPutBatchAllOrNothing: a refused item publishes nothing.
func TestPutBatchAllOrNothing(t *testing.T) {
	_, a, _ := pair(t, `{"allow":["shm"]}`)
	ctx := context.Background()
	good := pattern(4096)
	_, err := a.PutBatch(ctx, []Region{
		{Mem: good, DType: "uint8", Shape: []int64{4096}},
		{Mem: good, DType: "complex128", Shape: []int64{4}},
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "item 1")
	assert.Equal(t, 0, a.Stats().Objects, "the first item was taken back")

	_, err = a.PutBatch(ctx, make([]Region, maxBatch+1))
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

// TestViewBatchOneLeaseRequest: a ViewBatch of a state dict's objects
// leases them with one request to their owner, not one per object (issue
// 23: one request per owner), and the views hold their leases past the
// caller's Release. Counted on the owner: every lease message it served
// carried all the batch's claims (a renewal that lands meanwhile carries
// them all too; per-object leases carry one each).
func TestViewBatchOneLeaseRequest(t *testing.T) {
	_, a, b := pair(t, `{"allow":["shm"],"slabs":true,"cluster_key":"`+slabKey+`","slab_bytes":8388608}`)
	ctx := context.Background()
	const items, n = 12, 64 << 10
	var regions []Region
	for i := 0; i < items; i++ {
		p, err := a.Alloc(ctx, n)
		require.NoError(t, err)
		mem := unsafe.Slice((*byte)(p), n)
		for k := range mem {
			mem[k] = byte(i + k)
		}
		regions = append(regions, Region{Mem: mem, DType: "uint8", Shape: []int64{n}})
	}
	refs, err := a.PutBatch(ctx, regions)
	require.NoError(t, err)
	leases := func() (msgs, claims int64) {
		gather := func() []*dto.MetricFamily { mfs, _ := a.rt.Registry().Gather(); return mfs }
		for {
			m := counterSeries(gather(), "tensorlane_lease_messages_total", "op")["lease"]
			c := counterSeries(gather(), "tensorlane_lease_requests_total", "op")["lease"]
			if counterSeries(gather(), "tensorlane_lease_messages_total", "op")["lease"] == m {
				return m, c // not torn by a message in between
			}
		}
	}
	m0, c0 := leases()
	views, err := b.ViewBatch(ctx, refs, ViewConfig{}, 0, 10*time.Second)
	require.NoError(t, err)
	m1, c1 := leases()
	for i, v := range views {
		require.NoError(t, v.Err, "item %d", i)
		assert.Equal(t, byte(i), *(*byte)(v.Ptr), "item %d", i)
	}
	require.Positive(t, m1-m0)
	assert.Equal(t, items*(m1-m0), c1-c0, "every lease message carried the whole batch (%d messages, %d claims)", m1-m0, c1-c0)
	for _, ref := range refs {
		require.NoError(t, b.Release(ctx, ref))
	}
	for i, v := range views {
		assert.Equal(t, byte(i), *(*byte)(v.Ptr), "item %d after Release: the view keeps its lease", i)
		require.NoError(t, b.ReleaseView(v.View))
	}
}
