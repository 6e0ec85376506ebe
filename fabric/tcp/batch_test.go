package tcp

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestBatchPipelinesOnOneConnection: a batch of small reads of one owner
// goes over one connection (its requests back to back), a refused item
// among them leaves the connection in step, and every item lands.
func TestBatchPipelinesOnOneConnection(t *testing.T) {
	f := newFixture(t, 1<<20, nil)
	const n = 100
	var srcs []fabric.Remote
	var dsts []tensor.Buffer
	for i := range n {
		r := f.remote(4096)
		r.Offset = int64(i * 1000)
		if i == 40 {
			r.Claim.Object = fabric.ObjectID{9} // unknown
		}
		srcs, dsts = append(srcs, r), append(dsts, f.dst(t, 4096))
	}
	sts, errs := f.tr.ReadBatch(context.Background(), srcs, dsts)
	for i := range n {
		if i == 40 {
			assert.ErrorIs(t, errs[i], fabric.ErrObjectNotFound)
			continue
		}
		require.NoError(t, errs[i], "item %d", i)
		got, _ := tensor.BytesOf(dsts[i])
		require.True(t, bytes.Equal(got, f.data[i*1000:i*1000+4096]), "item %d", i)
		assert.Equal(t, n, sts[i].Coalesced)
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(f.tr.m.dials), "one connection for 400 KiB of small objects")
	assert.Equal(t, int64(n), f.opens.Load())
	// The connection went back to the pool in step: the next batch reuses it.
	_, errs = f.tr.ReadBatch(context.Background(), srcs[:3], dsts[:3])
	require.NoError(t, errors.Join(errs...))
	assert.Equal(t, 1.0, testutil.ToFloat64(f.tr.m.dials))
}

// TestBatchLanes: a larger batch spreads over Streams lanes, objects big
// enough to stripe go beside them, and the bytes are right.
func TestBatchLanes(t *testing.T) {
	f := newFixture(t, 8<<20, nil)
	sizes := []int64{8 << 20, 3 << 20, 1<<20 + 1, 700 << 10, 300 << 10, 5}
	for range 30 {
		sizes = append(sizes, 64<<10)
	}
	var srcs []fabric.Remote
	var dsts []tensor.Buffer
	for _, s := range sizes {
		srcs, dsts = append(srcs, f.remote(s)), append(dsts, f.dst(t, s))
	}
	_, errs := f.tr.ReadBatch(context.Background(), srcs, dsts)
	for i, s := range sizes {
		require.NoError(t, errs[i], "item %d", i)
		got, _ := tensor.BytesOf(dsts[i])
		require.True(t, bytes.Equal(got, f.data[:s]), "item %d", i)
	}
	assert.Len(t, f.tr.lanes([]int{6, 7, 8}, srcs), 1, "192 KiB: one lane")
	assert.Len(t, f.tr.lanes([]int{1, 2, 3, 4}, srcs), 4, "5 MiB: Streams lanes")
}

// TestBatchCorruptLane: a corrupted block fails its item; the items
// queued behind it on the lane fail with ErrPeerClosed (the planner reads
// them again alone); the transport works afterwards.
func TestBatchCorruptLane(t *testing.T) {
	f := newFixture(t, 1<<20, nil)
	var srcs []fabric.Remote
	var dsts []tensor.Buffer
	for range 5 {
		srcs, dsts = append(srcs, f.remote(64<<10)), append(dsts, f.dst(t, 64<<10))
	}
	f.srv.corruptNext.Store(true)
	_, errs := f.tr.ReadBatch(context.Background(), srcs, dsts)
	assert.ErrorIs(t, errs[0], fabric.ErrCorrupt)
	for _, err := range errs[1:] {
		assert.ErrorIs(t, err, fabric.ErrPeerClosed)
		assert.False(t, fabric.Terminal(err))
	}
	_, errs = f.tr.ReadBatch(context.Background(), srcs, dsts)
	require.NoError(t, errors.Join(errs...))
}
