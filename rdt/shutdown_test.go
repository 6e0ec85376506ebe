package rdt

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestShutdownRefusesNewWorkAndDrains (issue 13, item 7): once Shutdown
// begins, the owner refuses new leases, reads (on any path) and pushes with
// ErrOwnerClosed, lets the read in flight finish, and returns as soon as it
// has, not at the end of its grace period.
func TestShutdownRefusesNewWorkAndDrains(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	c := sameHostRuntime(t, p, nil)
	owner := must(p.a.Spawn("owner"))
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Float32, 1<<16)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	slot, err := owner.Reserve(ctx, tensor.NewDesc(tensor.Float32, 16), tensor.GPUDevice(1))
	require.NoError(t, err)
	defer slot.Close()
	pusher := must(p.b.Spawn("pusher"))
	y, err := pusher.Put(ctx, fill(t, p.b, tensor.GPUDevice(0), tensor.Float32, 16))
	require.NoError(t, err)

	// The first read to pin the object waits in the owner until released.
	inflight, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	p.a.objects.SetHooks(objstore.Hooks{Pinned: func(context.Context) {
		first.Do(func() {
			close(inflight)
			<-release
		})
	}})

	far := must(p.b.Spawn("far"))
	type result struct {
		t   tensor.Tensor
		err error
	}
	got := make(chan result, 1)
	go func() {
		x, err := far.Get(ctx, ref, tensor.GPUDevice(2))
		got <- result{x, err}
	}()
	<-inflight

	// A grace far longer than the test: returning before it ran out shows
	// Shutdown went on once the read drained.
	grace, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- p.a.Shutdown(grace) }()
	require.Eventually(t, p.a.objects.Closing, 10*time.Second, time.Millisecond)

	// New work, after Shutdown began: a reader without a lease is refused
	// at the lease; one holding a lease already is refused on the data
	// path; a push into one of the owner's slots is refused.
	_, err = must(c.Spawn("late")).Get(ctx, ref, tensor.HostDevice)
	assert.ErrorIs(t, err, ErrOwnerClosed, "new lease")
	assert.ErrorIs(t, err, net.ErrClosed)
	_, err = must(p.b.Spawn("far-again")).Get(ctx, ref, tensor.GPUDevice(3))
	assert.ErrorIs(t, err, ErrOwnerClosed, "new read under a held lease")
	_, err = pusher.Push(ctx, y, slot.Ref())
	assert.ErrorIs(t, err, ErrOwnerClosed, "new push")
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned (%v) while a read was in flight", err)
	default:
	}

	// The read in flight finishes, whole, and Shutdown returns with it.
	close(release)
	r := <-got
	require.NoError(t, r.err)
	sameBytes(t, x, r.t)
	require.NoError(t, r.t.Release())
	require.NoError(t, <-stopped)
	assert.NoError(t, grace.Err(), "Shutdown waited for its whole grace period")
}
