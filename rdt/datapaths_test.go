package rdt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// sameHostRuntime starts another runtime claiming the pair's first host:
// another process as far as the planner is concerned, so the shared-memory
// paths serve it.
func sameHostRuntime(t *testing.T, p pair, mutate func(*Config)) *Runtime {
	t.Helper()
	ctx := context.Background()
	cfg := Config{Cluster: p.cluster, Host: "h0", IgnoreEnv: true, RuntimeDir: t.TempDir(), DeviceMemory: 256 << 20}
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := New(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { r.Shutdown(ctx) })
	return r
}

func TestCrossRuntimePaths(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	c := sameHostRuntime(t, p, nil)
	owner, _ := p.a.Spawn("owner")
	neighbour, _ := c.Spawn("neighbour")
	far, _ := p.b.Spawn("far")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.BFloat16, 1024, 257)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	b, err := ref.MarshalBinary()
	require.NoError(t, err)
	t.Logf("a ref with tcp, shm and 8 rdma rails is %d bytes", len(b))

	for _, tc := range []struct {
		name   string
		reader *Actor
		dst    tensor.DeviceID
		path   string
	}{
		{"same host, NVLink-linked GPU, other runtime", neighbour, tensor.GPUDevice(3), fabric.P2P},
		{"same host, host memory, other runtime", neighbour, tensor.HostDevice, fabric.SHM},
		{"other host", far, tensor.GPUDevice(6), fabric.RDMA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, xfer, err := tc.reader.Fetch(ctx, ref, tc.dst)
			require.NoError(t, err)
			defer got.Release()
			assert.Equal(t, tc.path, xfer.Stats.Transport)
			assert.False(t, xfer.Plan.Degraded, "%v", xfer.Plan)
			sameBytes(t, x, got)
		})
	}

	// Host memory is shareable too (memfd-backed), so an object there
	// reaches a neighbour over shm, not tcp.
	hx := fill(t, p.a, tensor.HostDevice, tensor.Float32, 1000)
	href, err := owner.Put(ctx, hx)
	require.NoError(t, err)
	got, xfer, err := neighbour.Fetch(ctx, href, tensor.GPUDevice(1))
	require.NoError(t, err)
	assert.Equal(t, fabric.SHM, xfer.Stats.Transport)
	sameBytes(t, hx, got)
	require.NoError(t, got.Release())

	// Free revokes: cached mappings and rdma registrations must not serve
	// the freed object.
	require.NoError(t, owner.Free(ctx, ref))
	for _, reader := range []*Actor{neighbour, far} {
		_, err := reader.Get(ctx, ref, tensor.GPUDevice(3))
		assert.ErrorIs(t, err, ErrObjectFreed)
	}
}

func TestPush(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		mutate func(*Config)
		reader func(p pair, c *Runtime) *Actor
		dst    tensor.DeviceID
		path   string
	}{
		{"same runtime over the device link", nil, func(p pair, _ *Runtime) *Actor { a, _ := p.a.Spawn("slot"); return a }, tensor.GPUDevice(1), fabric.P2P},
		{"same host, other runtime", nil, func(_ pair, c *Runtime) *Actor { a, _ := c.Spawn("slot"); return a }, tensor.GPUDevice(2), fabric.P2P},
		{"other host over rdma", nil, func(p pair, _ *Runtime) *Actor { a, _ := p.b.Spawn("slot"); return a }, tensor.GPUDevice(2), fabric.RDMA},
		{"other host over tcp", func(c *Config) { c.Transports.DisableRDMA = true }, func(p pair, _ *Runtime) *Actor { a, _ := p.b.Spawn("slot"); return a }, tensor.GPUDevice(2), fabric.TCP},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, tc.mutate)
			c := sameHostRuntime(t, p, tc.mutate)
			owner, _ := p.a.Spawn("trainer")
			reader := tc.reader(p, c)
			x := fill(t, p.a, tensor.GPUDevice(0), tensor.BFloat16, 512, 300)
			src, err := owner.Put(ctx, x)
			require.NoError(t, err)

			slot, err := reader.Reserve(ctx, x.Desc(), tc.dst)
			require.NoError(t, err)
			defer slot.Close()
			for step := uint64(1); step <= 2; step++ {
				xfer, err := owner.Push(ctx, src, slot.Ref())
				require.NoError(t, err)
				assert.Equal(t, tc.path, xfer.Stats.Transport)
				n, got, err := slot.Wait(ctx, step-1)
				require.NoError(t, err)
				assert.Equal(t, step, n)
				assert.Equal(t, tc.dst, got.Device())
				sameBytes(t, x, got)
			}

			// A forged slot capability is refused, and a closed slot is gone.
			forged := slot.Ref()
			forged.Token = []byte("not the slot's token")
			_, err = owner.Push(ctx, src, forged)
			assert.ErrorIs(t, err, ErrUnauthorized)
			require.NoError(t, slot.Close())
			require.NoError(t, slot.Close(), "Close is idempotent")
			_, err = owner.Push(ctx, src, slot.Ref())
			assert.Error(t, err)
		})
	}
}

func TestPushNeedsOwnership(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("owner")
	other, _ := p.b.Spawn("other")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 4096)
	src, err := owner.Put(ctx, x)
	require.NoError(t, err)
	slot, err := owner.Reserve(ctx, x.Desc(), tensor.GPUDevice(1))
	require.NoError(t, err)
	defer slot.Close()
	_, err = other.Push(ctx, src, slot.Ref())
	assert.ErrorIs(t, err, ErrNotOwner)
}

func FuzzParsePushNotice(f *testing.F) {
	f.Add(ctlwire.PushNotice{Slot: fabric.ObjectID{1}, Incarnation: 9, Token: []byte("0123456789abcdef"), Bytes: 4096}.Marshal())
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, p []byte) {
		n, err := ctlwire.ParsePushNotice(p)
		if err != nil {
			return
		}
		again, err := ctlwire.ParsePushNotice(n.Marshal())
		require.NoError(t, err)
		assert.Equal(t, n, again)
	})
}

// A runtime that runs rdma meets one that does not: neither direction
// tries rdma (whose address the other side's refs do not carry) before
// going over tcp, so a mixed cluster pays no failed attempt per transfer.
func TestMixedRDMAUsesTCPWithoutTryingRDMA(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil) // both run rdma
	plain := sameHostRuntime(t, p, func(c *Config) { c.Host, c.Transports.DisableRDMA = "h1", true })
	withRDMA, _ := p.a.Spawn("with-rdma")
	without, _ := plain.Spawn("without-rdma")

	// Push from the rdma runtime into a slot of the one without.
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 4096)
	src, err := withRDMA.Put(ctx, x)
	require.NoError(t, err)
	slot, err := without.Reserve(ctx, x.Desc(), tensor.GPUDevice(1))
	require.NoError(t, err)
	defer slot.Close()
	xfer, err := withRDMA.Push(ctx, src, slot.Ref())
	require.NoError(t, err)
	assert.Equal(t, fabric.TCP, xfer.Stats.Transport)
	assert.Contains(t, xfer.Plan.String(), "publishes no rdma address")

	// Pull the other way: the rdma runtime reads from the one without.
	y := fill(t, plain, tensor.GPUDevice(0), tensor.Uint8, 4096)
	ref, err := without.Put(ctx, y)
	require.NoError(t, err)
	got, xfer, err := withRDMA.Fetch(ctx, ref, tensor.GPUDevice(2))
	require.NoError(t, err)
	defer got.Release()
	assert.Equal(t, fabric.TCP, xfer.Stats.Transport)
	assert.Contains(t, xfer.Plan.String(), "the owner publishes no rdma address")
	sameBytes(t, y, got)
}

// Push notices reuse a stream per slot runtime, and a pooled stream that
// died with its connection is replaced without failing the push or
// counting it twice.
func TestPushNoticeStreamsAreReused(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("trainer")
	reader, _ := p.b.Spawn("slot")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 4096)
	src, err := owner.Put(ctx, x)
	require.NoError(t, err)
	slot, err := reader.Reserve(ctx, x.Desc(), tensor.GPUDevice(1))
	require.NoError(t, err)
	defer slot.Close()
	idle := func() int {
		return p.a.notices.IdleTo(p.b.ID())
	}
	for step := uint64(1); step <= 3; step++ {
		_, err := owner.Push(ctx, src, slot.Ref())
		require.NoError(t, err)
		n, _, err := slot.Wait(ctx, step-1)
		require.NoError(t, err)
		assert.Equal(t, step, n)
		assert.Equal(t, 1, idle(), "one stream carries every notice")
	}
	// The connection drops: the pooled stream is dead, the next push
	// notices on a new one, and the slot counts it once.
	require.NoError(t, p.a.host.Network().ClosePeer(p.b.ID()))
	_, err = owner.Push(ctx, src, slot.Ref())
	require.NoError(t, err)
	n, _, err := slot.Wait(ctx, 3)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), n)
	assert.Equal(t, 1, idle())
}
