package rdt

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

func tcpDials(t *testing.T, reg prometheus.Gatherer) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "tensorlane_tcp_dials_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// TestWarmPreconnects: Warm on a ref another host owns opens the tcp
// connections its Get stripes over, and the Get then dials none.
func TestWarmPreconnects(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, func(c *Config) { c.Transports.DisableRDMA = true })
	owner, err := p.a.Spawn("owner")
	require.NoError(t, err)
	far, err := p.b.Spawn("far")
	require.NoError(t, err)
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 32<<20)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)

	require.Zero(t, tcpDials(t, p.b.Registry()))
	require.NoError(t, far.Warm(ctx, ref, tensor.GPUDevice(1)))
	warmed := tcpDials(t, p.b.Registry())
	assert.Positive(t, warmed, "Warm dialed")

	got, xfer, err := far.Fetch(ctx, ref, tensor.GPUDevice(1))
	require.NoError(t, err)
	defer got.Release()
	assert.Equal(t, fabric.TCP, xfer.Stats.Transport)
	sameBytes(t, x, got)
	assert.Equal(t, warmed, tcpDials(t, p.b.Registry()), "the Get found its connections open")
	assert.Equal(t, float64(xfer.Stats.Streams), warmed, "one connection per stripe")
}

// TestWarmRefuses: what Get would refuse, Warm refuses the same way.
func TestWarmRefuses(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, func(c *Config) { c.Transports.DisableRDMA = true })
	owner, _ := p.a.Spawn("owner")
	far, _ := p.b.Spawn("far", WithDevices(tensor.GPUDevice(1)))
	ref, err := owner.Put(ctx, fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 4096))
	require.NoError(t, err)

	_, getErr := far.Get(ctx, ref, tensor.GPUDevice(3))
	assert.Error(t, getErr)
	assert.Equal(t, getErr, far.Warm(ctx, ref, tensor.GPUDevice(3)), "a device the actor may not use")

	bad := ref
	bad.Desc.Shape = nil
	bad.Desc.Strides = []int64{1, 2}
	assert.ErrorIs(t, far.Warm(ctx, bad, tensor.GPUDevice(1)), ErrMalformedRef)

	require.NoError(t, p.b.Shutdown(ctx))
	assert.ErrorIs(t, far.Warm(ctx, ref, tensor.GPUDevice(1)), ErrClosed)
}
