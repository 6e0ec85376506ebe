package rdt

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// sameHost starts two runtimes claiming one host: two processes to the
// planner, joined by the shared-memory paths.
func sameHost(t *testing.T) (*Runtime, *Runtime) {
	t.Helper()
	ctx := context.Background()
	cl, err := topology.Preset("dgx-h100", 1)
	require.NoError(t, err)
	var rts []*Runtime
	for range 2 {
		cfg := Config{Cluster: cl, Host: "h0", IgnoreEnv: true, RuntimeDir: t.TempDir(), DeviceMemory: 64 << 20}
		fastLife(&cfg)
		r, err := New(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { r.Shutdown(ctx) })
		rts = append(rts, r)
	}
	require.NoError(t, rts[1].Connect(ctx, rts[0].AddrInfo()))
	return rts[0], rts[1]
}

func TestViewZeroCopy(t *testing.T) {
	ctx := context.Background()
	a, b := sameHost(t)
	owner, _ := a.Spawn("trainer")
	reader, _ := b.Spawn("engine")
	x := fill(t, a, tensor.GPUDevice(0), tensor.BFloat16, 1024, 1024)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)

	used := b.Memory
	before := func() int64 { m, _ := used(tensor.GPUDevice(0)); return m.Stats().Used }()
	v, err := reader.View(ctx, ref)
	require.NoError(t, err)
	assert.True(t, v.Transfer.Stats.ZeroCopy)
	assert.Contains(t, []string{fabric.P2P, fabric.SHM}, v.Transfer.Stats.Transport)
	sameBytes(t, x, v.Tensor)
	assert.Equal(t, before, func() int64 { m, _ := used(tensor.GPUDevice(0)); return m.Stats().Used }(), "the reader allocated nothing")
	// In place: the owner's next write shows through.
	p, _ := x.SpanBytes()
	p[5] ^= 0xff
	q, _ := v.Tensor.SpanBytes()
	assert.Equal(t, p[5], q[5])
	saved := bytes.Clone(p[:64]) // the owner's mapping goes with Free

	// The lease keeps it alive after the owner's Release; Free revokes it.
	require.NoError(t, owner.Release(ctx, ref))
	assert.Equal(t, 1, a.Objects(), "held by the reader's lease")
	select {
	case <-v.Revoked():
		t.Fatal("revoked while held")
	default:
	}
	require.NoError(t, owner.Free(ctx, ref))
	select {
	case <-v.Revoked():
	case <-time.After(10 * time.Second):
		t.Fatal("a freed object's view was not revoked")
	}
	assert.Equal(t, saved, q[:64], "a revoked view still shows the freed object, never other bytes")
	require.NoError(t, v.Release())
	require.NoError(t, v.Release())
	_, err = reader.View(ctx, ref)
	assert.ErrorIs(t, err, ErrObjectFreed)
}

func TestViewNeedsSameHost(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("trainer")
	reader, _ := p.b.Spawn("engine")
	local, _ := p.a.Spawn("near")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Float32, 256)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	_, err = reader.View(ctx, ref)
	assert.ErrorIs(t, err, ErrNoZeroCopy)
	// In the owner's runtime a view is the owner's own memory.
	v, err := local.View(ctx, ref)
	require.NoError(t, err)
	sameBytes(t, x, v.Tensor)
	require.NoError(t, v.Release())
}
