package rdt

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
)

// A runtime whose GPUs are CUDA memory (the fake driver here, a real one
// under scripts/gpu-check.sh's build): Put a tensor in GPU 0, Get it on
// the same device (a view), on GPU 1 (a peer copy by the device), into
// host memory (out through staging), and from the other host.
func TestCUDADevices(t *testing.T) {
	cudatest.NoLeaks(t)
	lib := cudatest.FakeLibrary(t)
	ctx := context.Background()
	var mems []*cuda.Memory
	for dev := range 2 {
		m, err := cuda.NewMemory(cuda.Config{Library: lib, Device: dev})
		require.NoError(t, err)
		mems = append(mems, m)
	}
	p := newPair(t, func(c *Config) {
		if c.Host == "h0" {
			c.Devices = []tensor.Memory{mems[0], mems[1]}
		}
	})
	t.Cleanup(func() {
		for _, m := range mems {
			m.Close()
		}
	})
	owner, err := p.a.Spawn("owner")
	require.NoError(t, err)
	near, err := p.a.Spawn("near")
	require.NoError(t, err)

	mem, err := p.a.Memory(tensor.GPUDevice(0))
	require.NoError(t, err)
	require.Same(t, mems[0], mem)
	x, err := tensor.Alloc(ctx, mem, tensor.BFloat16, 1024, 513)
	require.NoError(t, err)
	want := make([]byte, x.Buffer().Len())
	for i := range want {
		want[i] = byte(i*31 + i>>11)
	}
	require.NoError(t, x.Buffer().(*cuda.Buffer).CopyIn(ctx, 0, want))
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)

	// The other host: over rdma, both ends staging device memory through
	// pinned host memory (the NICs read the owner's staged copy).
	far, err := p.b.Spawn("far")
	require.NoError(t, err)
	got, xfer, err := far.Fetch(ctx, ref, tensor.GPUDevice(2))
	require.NoError(t, err)
	assert.Equal(t, fabric.RDMA, xfer.Stats.Transport, "plan %+v", xfer.Plan)
	assert.False(t, xfer.Plan.Degraded)
	pb, err := got.SpanBytes()
	require.NoError(t, err)
	require.True(t, bytes.Equal(pb, want), "bytes differ on the other host")
	got.Release()

	for _, tc := range []struct {
		name string
		dst  tensor.DeviceID
		path string
	}{
		{"same device view", tensor.GPUDevice(0), fabric.Local},
		{"peer copy", tensor.GPUDevice(1), fabric.P2P},
		{"device to host", tensor.HostDevice, fabric.Local},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, xfer, err := near.Fetch(ctx, ref, tc.dst)
			require.NoError(t, err)
			defer got.Release()
			assert.Equal(t, tc.path, xfer.Stats.Transport)
			assert.Equal(t, tc.dst, got.Device())
			hb, err := tensor.NewHostMemory(0).Alloc(ctx, int64(len(want)))
			require.NoError(t, err)
			defer hb.Release()
			require.NoError(t, tensor.Copy(ctx, hb, 0, got.Buffer(), 0, int64(len(want))))
			b, _ := tensor.BytesOf(hb)
			require.True(t, bytes.Equal(b, want), "bytes differ")
		})
	}
}
