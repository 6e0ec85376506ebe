package rdt

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

func TestObserveTransfers(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	require.NoError(t, p.a.Connect(ctx, p.b.AddrInfo()))
	owner, err := p.a.Spawn("owner", WithDevices(tensor.GPUDevice(0)))
	require.NoError(t, err)
	near, err := p.a.Spawn("near", WithDevices(tensor.GPUDevice(1)))
	require.NoError(t, err)
	far, err := p.b.Spawn("far", WithDevices(tensor.GPUDevice(2)))
	require.NoError(t, err)

	x := fill(t, p.a, tensor.GPUDevice(0), tensor.BFloat16, 64, 1024)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)

	objs := p.a.ObjectTable()
	require.Len(t, objs, 1)
	assert.Equal(t, ObjectInfo{ID: ref.Object.String(), Host: "h0", Owner: "owner", Device: "gpu:0", DType: "bfloat16", Shape: []int64{64, 1024}, Bytes: 128 << 10}, objs[0])

	got, err := near.Get(ctx, ref, tensor.GPUDevice(1))
	require.NoError(t, err)
	got.Release()
	dst := fill(t, p.b, tensor.GPUDevice(2), tensor.BFloat16, 64, 1024)
	_, err = far.GetInto(ctx, ref, dst)
	require.NoError(t, err)
	dst.Release()

	// A read that fails: the object is freed.
	require.NoError(t, owner.Free(ctx, ref))
	_, err = near.Get(ctx, ref, tensor.GPUDevice(1))
	require.ErrorIs(t, err, ErrObjectFreed)

	recA := p.a.RecentTransfers()
	require.Len(t, recA, 2)
	assert.Equal(t, "object_freed", recA[0].ErrorKind, "newest first")
	assert.NotEmpty(t, recA[0].Error)
	ok := recA[1]
	assert.Equal(t, fabric.P2P, ok.Path)
	assert.Equal(t, "near", ok.Reader)
	assert.Equal(t, "h0/gpu:0", ok.Src)
	assert.Equal(t, "h0/gpu:1", ok.Dst)
	assert.Equal(t, int64(128<<10), ok.Bytes)
	assert.False(t, ok.Live || ok.Degraded || ok.Fallback)
	assert.Positive(t, ok.GBps)

	recB := p.b.RecentTransfers()
	require.Len(t, recB, 1)
	assert.Equal(t, fabric.RDMA, recB[0].Path)
	assert.Equal(t, "h1/gpu:2", recB[0].Dst)
	assert.Empty(t, p.a.LiveTransfers())
	assert.Empty(t, p.a.ObjectTable())

	assert.Equal(t, 1.0, testutil.ToFloat64(p.a.obs.Errors.WithLabelValues("object_freed")))
	n, err := testutil.GatherAndCount(p.a.Registry(), "tensorlane_device_memory_used_bytes")
	require.NoError(t, err)
	assert.Equal(t, 9, n, "eight GPUs and host memory")
	stats := p.a.MemoryStats()
	require.Len(t, stats, 9)
	assert.True(t, stats[0].Device.IsHost())
	assert.True(t, stats[1].Simulated)
}

func TestObserveRingAndLive(t *testing.T) {
	p := newPair(t, nil)
	ref := Ref{Host: "h1", Device: tensor.GPUDevice(3)}
	ends := make([]func(fabric.Plan, fabric.Stats, error), 0, RecentTransfers+10)
	for i := 0; i < RecentTransfers+10; i++ {
		ends = append(ends, p.a.observeRead(fmt.Sprintf("r%d", i), ref, p.a.endpoint(tensor.GPUDevice(0))))
	}
	live := p.a.LiveTransfers()
	require.Len(t, live, RecentTransfers+10)
	assert.True(t, live[0].Live)
	assert.Equal(t, "r0", live[0].Reader)
	for i, end := range ends {
		var err error
		if i%2 == 1 {
			err = fmt.Errorf("wrapped: %w", fabric.ErrStalled)
		}
		end(fabric.Plan{Chosen: fabric.RDMA, Best: fabric.RDMA}, fabric.Stats{Transport: fabric.TCP, Bytes: 10}, err)
	}
	assert.Empty(t, p.a.LiveTransfers())
	rec := p.a.RecentTransfers()
	require.Len(t, rec, RecentTransfers, "bounded ring")
	assert.Equal(t, fmt.Sprintf("r%d", RecentTransfers+9), rec[0].Reader)
	assert.Equal(t, "r10", rec[len(rec)-1].Reader)
	assert.True(t, rec[1].Fallback, "tcp moved the bytes although the plan chose rdma")
	assert.Equal(t, "stalled", rec[0].ErrorKind)
}

func TestErrorKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{ErrObjectNotFound, "object_not_found"},
		{fmt.Errorf("x: %w", fabric.ErrCorrupt), "corrupt"},
		{&fabric.PathError{Transport: "tcp", Err: fabric.ErrPeerClosed}, "peer_closed"},
		{context.DeadlineExceeded, "timeout"},
		{ErrClosed, "closed"},
		{fmt.Errorf("owner refused the lease: %w", ErrOwnerClosed), "owner_closed"},
		{ErrLayoutMismatch, "layout_mismatch"},
		{ErrMalformedRef, "malformed_ref"},
		{errors.New("boom"), "other"},
	} {
		assert.Equal(t, c.want, ErrorKind(c.err), "%v", c.err)
	}
}
