package rdt

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestLinkTelemetryRuntime: with LinkTelemetry a runtime tracks its data
// connections (the rdma rails it dials as a reader, those it accepts as an
// owner) under labels that name host, NIC and peer, and Links and
// LinkMonitor expose them; without it both are empty.
func TestLinkTelemetryRuntime(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, func(c *Config) { c.Transports.LinkTelemetry = true })
	owner, err := p.a.Spawn("owner")
	require.NoError(t, err)
	far, err := p.b.Spawn("far")
	require.NoError(t, err)
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Float32, 1024, 1024)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	got, xfer, err := far.Fetch(ctx, ref, tensor.GPUDevice(0))
	require.NoError(t, err)
	defer got.Release()
	sameBytes(t, x, got)
	require.Equal(t, fabric.RDMA, xfer.Stats.Transport)
	require.True(t, p.b.RefreshLinks())
	links := p.b.Links()
	require.NotEmpty(t, links, "the reader's rails are tracked")
	received := uint64(0)
	for _, l := range links {
		assert.Equal(t, fabric.RDMA, l.Transport)
		assert.True(t, strings.HasPrefix(l.Link, "h1/"), l.Link)
		assert.Contains(t, l.Link, "->", "the reader dials its rails")
		received += l.BytesReceived
	}
	// In eBPF mode a link's figures are those of its socket's last
	// sock_ops callback, so one that only receives lags by up to about a
	// window (32 KiB seen on loopback); the read is striped over up to
	// eight rails.
	assert.GreaterOrEqual(t, received+uint64(len(links))*(64<<10), uint64(4<<20), "the rails carried the 4 MiB read")
	require.True(t, p.a.RefreshLinks())
	owned := p.a.Links()
	require.NotEmpty(t, owned, "the owner tracks the rail connections it accepted")
	for _, l := range owned {
		assert.Contains(t, l.Link, "<-", l.Link)
	}

	// tcp streams are tracked too (measured and shown, not paused).
	tp := newPair(t, func(c *Config) { c.Transports.LinkTelemetry = true; c.Transports.Allow = []string{fabric.TCP} })
	towner, _ := tp.a.Spawn("owner")
	tfar, _ := tp.b.Spawn("far")
	tref, err := towner.Put(ctx, fill(t, tp.a, tensor.GPUDevice(0), tensor.Float32, 256, 1024))
	require.NoError(t, err)
	tgot, txfer, err := tfar.Fetch(ctx, tref, tensor.GPUDevice(0))
	require.NoError(t, err)
	defer tgot.Release()
	require.Equal(t, fabric.TCP, txfer.Stats.Transport)
	require.True(t, tp.b.RefreshLinks())
	tcpLinks := 0
	for _, l := range tp.b.Links() {
		if l.Transport == fabric.TCP {
			tcpLinks++
			assert.True(t, strings.HasPrefix(l.Link, "h1 tcp->"), l.Link)
		}
	}
	assert.NotZero(t, tcpLinks, "the tcp data streams are tracked: %+v", tp.b.Links())

	off := newPair(t, nil)
	assert.False(t, off.a.RefreshLinks())
	assert.Nil(t, off.a.Links())
}
