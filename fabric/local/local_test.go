package local

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

type nopPin struct{ tensor.Buffer }

func (nopPin) Release() error  { return nil }
func (p nopPin) Bytes() []byte { return p.Buffer.(tensor.HostVisible).Bytes() }

func TestLocalAndP2P(t *testing.T) {
	ctx := context.Background()
	cl, err := topology.Preset("dgx-h100", 1)
	require.NoError(t, err)
	gpu0, err := tensor.NewSimMemory(tensor.GPUDevice(0), 64<<20)
	require.NoError(t, err)
	defer gpu0.Close()
	obj, err := gpu0.Alloc(ctx, 20<<20)
	require.NoError(t, err)
	src, _ := tensor.BytesOf(obj)
	for i := range src {
		src[i] = byte(i * 13)
	}
	cfg := Config{Process: "p", Topology: cl, Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nopPin{obj}, nil })}
	l, p2p := New(cfg), NewP2P(cfg)
	at := func(proc string, dev tensor.DeviceID) fabric.Endpoint {
		return fabric.Endpoint{Process: proc, Host: "h0", Device: dev}
	}

	_, ok := l.Reach(at("p", tensor.GPUDevice(0)), at("q", tensor.GPUDevice(0)))
	assert.False(t, ok, "another runtime is not local")
	c, ok := l.Reach(at("p", tensor.GPUDevice(0)), at("p", tensor.GPUDevice(0)))
	assert.True(t, ok)
	assert.Contains(t, c.Reason, "zero-copy")
	c, ok = p2p.Reach(at("p", tensor.GPUDevice(0)), at("p", tensor.GPUDevice(4)))
	assert.True(t, ok)
	assert.Equal(t, "NV18", c.Path.String())
	_, ok = p2p.Reach(at("p", tensor.GPUDevice(0)), at("p", tensor.HostDevice))
	assert.False(t, ok, "host memory has no device link")

	view, err := l.View(ctx, fabric.Remote{})
	require.NoError(t, err)
	vb, _ := tensor.BytesOf(view)
	assert.Same(t, &src[0], &vb[0])

	dst, err := tensor.NewHostMemory(0).Alloc(ctx, 20<<20-5)
	require.NoError(t, err)
	defer dst.Release()
	st, err := p2p.Read(ctx, fabric.Remote{Offset: 5, Length: 20<<20 - 5}, dst)
	require.NoError(t, err)
	assert.Equal(t, int64(20<<20-5), st.Bytes)
	got, _ := tensor.BytesOf(dst)
	assert.True(t, bytes.Equal(src[5:], got))

	_, err = l.Read(ctx, fabric.Remote{Offset: 1, Length: 20 << 20}, dst)
	assert.ErrorIs(t, err, fabric.ErrBadRequest)
	_, err = l.Read(ctx, fabric.Remote{Length: 20<<20 - 4}, dst)
	assert.ErrorIs(t, err, tensor.ErrTooSmall)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = l.Read(cctx, fabric.Remote{Length: 1}, dst)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NoError(t, l.Close())
	assert.NoError(t, p2p.Close())
}
